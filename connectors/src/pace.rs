//! `max_records_per_second`: a source's replay pace.

use std::time::{Duration, Instant};

/// Credit a source may build up while it had nothing to send (a slow start, an outage, a
/// paused pipeline): spent at once, so a burst after an idle spell is at most this long's
/// worth of records, not the whole idle time's.
const SLACK: Duration = Duration::from_millis(100);

/// Paces records to `rate` per second.
#[derive(Debug)]
pub(crate) struct Pacer {
    rate: f64,
    /// When the pace started, moved forward after idle spells.
    start: Option<Instant>,
    sent: u64,
}

impl Pacer {
    pub(crate) fn new(rate: f64) -> Pacer {
        Pacer {
            rate: rate.max(f64::MIN_POSITIVE),
            start: None,
            sent: 0,
        }
    }

    /// Waits until `n` more records keep the pace (the first ones go at once), then counts
    /// them. Calls with nothing to send (`n == 0`) neither wait nor start the pace.
    pub(crate) fn admit(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        let now = Instant::now();
        let start = *self.start.get_or_insert(now);
        let due = Duration::from_secs_f64(self.sent as f64 / self.rate);
        let elapsed = now.duration_since(start);
        if let Some(wait) = due.checked_sub(elapsed) {
            std::thread::sleep(wait);
        } else if elapsed > due + SLACK {
            self.start = now.checked_sub(due + SLACK).or(Some(start));
        }
        self.sent += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_spell_earns_a_short_burst_only() {
        let mut pacer = Pacer::new(100.0);
        pacer.admit(1);
        // Idle for 300 ms: 30 records' worth of time.
        std::thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        // 20 records: 10 fit in the slack (100 ms at 100/s), the other 10 wait ~100 ms.
        for _ in 0..20 {
            pacer.admit(1);
        }
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(80),
            "burst after idling: {took:?}"
        );
    }

    #[test]
    fn records_keep_the_rate() {
        let mut pacer = Pacer::new(200.0);
        let t = Instant::now();
        for _ in 0..21 {
            pacer.admit(1);
        }
        // 20 intervals of 5 ms.
        assert!(
            t.elapsed() >= Duration::from_millis(95),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn empty_polls_do_not_start_the_pace() {
        let mut pacer = Pacer::new(10.0);
        pacer.admit(0);
        assert!(pacer.start.is_none());
        pacer.admit(1);
        assert!(pacer.start.is_some());
    }
}
