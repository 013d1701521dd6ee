//! One cluster per object-store prefix: the lease object `<prefix>/riffle.lease`.
//!
//! Two clusters checkpointing to one prefix would resume from each other's checkpoints and
//! write the same results twice. A local directory has a file lock for that; an object store
//! has none, so the run's process 0 takes a lease instead: an object naming its owner (host,
//! pid and start time, run generation) and when it last renewed it, created with a conditional
//! put. The checkpoint writer renews it every third of the timeout with a conditional update
//! (`If-Match` on the version it wrote last), and confirms it before a checkpoint whenever the
//! last confirmation is older than that; a clean exit, or a failed one, removes it.
//!
//! A run finding a lease renewed within its timeout by another owner is refused. A lease not
//! renewed for its timeout (its holder was killed, or its host lost), or whose process is gone
//! from this very host (by pid and start time: a restarted container may reuse the pid), is
//! taken over with a conditional update of the version read, so of two runs taking over at
//! once only one wins.
//!
//! The window that remains: freshness is judged by the holder's clock against the taker's, so
//! hosts' clocks must agree to well within the timeout; and a holder that could not reach the
//! store for a whole timeout (a partition, a process paused for that long) may be taken over
//! while it still runs. It learns so at its next renewal or checkpoint (the conditional update
//! fails) and stops. A checkpoint that passed its lease check just before a pause can still
//! land (at most one renewal period and one request's timeout late): checkpoint objects are
//! never overwritten, so each stays intact, but a restart may resume from the stopped run's
//! checkpoint; and until it reaches the store again, the cut-off holder keeps writing results
//! (transactional sinks fence it themselves; a file sink does not). See docs/fault-tolerance.md.

use std::time::{Duration, Instant};

use riffle_storage::{Location, Version};
use serde::{Deserialize, Serialize};

use super::store_error;
use crate::error::{DataflowError, DataflowResult};

/// The lease's object name under the checkpoint prefix.
pub const LEASE: &str = "riffle.lease";

/// Who holds a lease, as its object says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub host: String,
    pub pid: u32,
    /// Which process that pid was (this boot's id and the process's start time): a later
    /// process with the same pid on the same host (a restarted container) is another one.
    #[serde(default)]
    pub process: String,
    /// The holder's run generation (its start time in milliseconds).
    pub generation: u64,
    /// When the holder last renewed it: milliseconds since the Unix epoch, by its clock.
    pub renewed_ms: u64,
    /// A lease not renewed for this long is taken over.
    pub timeout_ms: u64,
}

impl Owner {
    fn me(generation: u64, timeout: Duration) -> Owner {
        Owner {
            host: host_name(),
            pid: std::process::id(),
            process: incarnation(std::process::id()).unwrap_or_default(),
            generation,
            renewed_ms: now_ms(),
            timeout_ms: timeout.as_millis() as u64,
        }
    }

    fn same_holder(&self, other: &Owner) -> bool {
        (&self.host, self.pid, self.generation) == (&other.host, other.pid, other.generation)
    }

    fn to_bytes(&self) -> Vec<u8> {
        // A struct of strings and numbers always serialises.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Why this lease may be taken over now, or `None` while its holder counts as alive.
    fn stale(&self, now_ms: u64) -> Option<String> {
        let age = now_ms.saturating_sub(self.renewed_ms);
        if age >= self.timeout_ms {
            return Some(format!(
                "not renewed for {:.1} s (timeout {:.1} s)",
                age as f64 / 1e3,
                self.timeout_ms as f64 / 1e3
            ));
        }
        if self.host == host_name() && proc_available() {
            let gone = match incarnation(self.pid) {
                None => true,
                // Older holders did not say which process; the pid alone then counts.
                Some(now) => !self.process.is_empty() && now != self.process,
            };
            if gone {
                return Some(format!("its process {} on this host is gone", self.pid));
            }
        }
        None
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pid {} on host {} (run {})",
            self.pid, self.host, self.generation
        )
    }
}

/// A lease this process holds.
#[derive(Debug)]
pub struct Lease {
    at: Location,
    version: Version,
    owner: Owner,
    confirmed: Instant,
}

/// Why a renewal did not happen.
#[derive(Debug)]
pub enum Renewal {
    /// Another run holds the lease now: this one must stop.
    Lost(DataflowError),
    /// The store did not answer; the lease may still be ours.
    Failed(DataflowError),
}

impl Lease {
    /// Takes the lease of the checkpoints at `at` for run `generation`: creates it, or takes
    /// over a stale one; fails naming the holder while another run holds it.
    pub fn acquire(at: &Location, generation: u64, timeout: Duration) -> DataflowResult<Lease> {
        let url = format!("{}/{LEASE}", at.url());
        let me = Owner::me(generation, timeout);
        // Each turn loses only to another run's write in between: look again.
        for _ in 0..3 {
            let found = at
                .get_versioned(LEASE)
                .map_err(|e| store_error("taking the checkpoints' lease", e))?;
            let Some((bytes, version)) = found else {
                let created = at
                    .put_new_versioned(LEASE, me.to_bytes())
                    .map_err(|e| store_error("taking the checkpoints' lease", e))?;
                if let Some(version) = created {
                    return Ok(Lease::held(at, version, me));
                }
                continue;
            };
            let holder = serde_json::from_slice::<Owner>(&bytes);
            let why = match &holder {
                Ok(holder) => match holder.stale(now_ms()) {
                    Some(why) => format!("{holder}: {why}"),
                    None => return Err(held(at, holder)),
                },
                Err(e) => format!("unreadable ({e})"),
            };
            let taken = at
                .put_if_match(LEASE, me.to_bytes(), &version)
                .map_err(|e| store_error("taking over the checkpoints' lease", e))?;
            if let Some(version) = taken {
                tracing::warn!("took over the lease {url} of {why}");
                return Ok(Lease::held(at, version, me));
            }
        }
        Err(DataflowError::Config(format!(
            "{url}: the lease changed under this run three times while taking it: another run \
             is starting on the same checkpoints"
        )))
    }

    fn held(at: &Location, version: Version, owner: Owner) -> Lease {
        tracing::info!("holding the lease {}/{LEASE}", at.url());
        Lease {
            at: at.clone(),
            version,
            owner,
            confirmed: Instant::now(),
        }
    }

    /// When the store last confirmed the lease was ours.
    pub fn confirmed(&self) -> Instant {
        self.confirmed
    }

    /// How often it is renewed: a third of its timeout.
    pub fn period(&self) -> Duration {
        Duration::from_millis(self.owner.timeout_ms / 3)
    }

    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    pub fn url(&self) -> String {
        format!("{}/{LEASE}", self.at.url())
    }

    /// Renews it: a conditional update of the version this run wrote last.
    pub fn renew(&mut self) -> Result<(), Renewal> {
        let mut next = self.owner.clone();
        next.renewed_ms = now_ms();
        let failed = |e| Renewal::Failed(store_error("renewing the checkpoints' lease", e));
        if let Some(version) = self
            .at
            .put_if_match(LEASE, next.to_bytes(), &self.version)
            .map_err(failed)?
        {
            self.version = version;
            self.owner = next;
            self.confirmed = Instant::now();
            return Ok(());
        }
        // Replaced: by this run's own earlier renewal whose answer was lost, or by a taker.
        let url = self.url();
        match self.at.get_versioned(LEASE).map_err(failed)? {
            Some((bytes, version)) => match serde_json::from_slice::<Owner>(&bytes) {
                Ok(there) if there.same_holder(&self.owner) => {
                    self.version = version;
                    self.owner = there;
                    self.confirmed = Instant::now();
                    Ok(())
                }
                Ok(there) => Err(Renewal::Lost(DataflowError::Config(format!(
                    "{url}: this run lost its lease to {there} (it was not renewed in time: \
                     the store was unreachable or this process was paused); stopping, so that \
                     only one run writes these checkpoints"
                )))),
                Err(e) => Err(Renewal::Lost(DataflowError::Config(format!(
                    "{url}: the lease was replaced by something unreadable ({e}); stopping"
                )))),
            },
            None => Err(Renewal::Lost(DataflowError::Config(format!(
                "{url}: the lease is gone (removed by hand or by another run); stopping, so \
                 that only one run writes these checkpoints"
            )))),
        }
    }

    /// Removes it, if it is still this run's (best effort: a lease left behind only makes the
    /// next run wait for its timeout).
    pub fn release(self) {
        let url = self.url();
        let left = |e: riffle_storage::StorageError| {
            tracing::warn!(
                "could not remove the lease {url} ({e}): the next run takes it over once it is \
                 {:.0} s old",
                self.owner.timeout_ms as f64 / 1e3
            )
        };
        match self.at.get_versioned(LEASE) {
            Ok(Some((bytes, _))) => match serde_json::from_slice::<Owner>(&bytes) {
                Ok(there) if there.same_holder(&self.owner) => match self.at.delete(LEASE) {
                    Ok(()) => tracing::info!("released the lease {url}"),
                    Err(e) => left(e),
                },
                _ => tracing::warn!("not removing {url}: another run holds it now"),
            },
            Ok(None) => {}
            Err(e) => left(e),
        }
    }
}

fn held(at: &Location, holder: &Owner) -> DataflowError {
    let age = now_ms().saturating_sub(holder.renewed_ms) as f64 / 1e3;
    DataflowError::Config(format!(
        "checkpoints at {} are in use by another run: {holder} renewed the lease {}/{LEASE} \
         {age:.1} s ago. A lease not renewed for {:.1} s is taken over \
         (runtime.checkpoint.lease_s); stop that run, or give this one another checkpoint url",
        at.url(),
        at.url(),
        holder.timeout_ms as f64 / 1e3
    ))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// This host's name (the kernel's, as `hostname` prints it).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// Whether this system shows its processes in `/proc` (elsewhere a holder on this host counts
/// as alive until its lease times out).
fn proc_available() -> bool {
    std::path::Path::new("/proc/self/stat").exists()
}

/// Which process `pid` of this host is (`<boot id>/<start time>`), or `None` when none runs
/// (or only its zombie is left).
fn incarnation(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command's closing parenthesis: state first, start time 20th.
    let (_, rest) = stat.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if matches!(fields.first(), Some(&"Z") | Some(&"X")) {
        return None;
    }
    let started = fields.get(19)?;
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    Some(format!("{}/{started}", boot.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use riffle_storage::StoreOptions;

    fn location(name: &str) -> Location {
        Location::parse(
            &format!("memory://lease-{name}/p"),
            &StoreOptions::default(),
        )
        .unwrap()
    }

    #[test]
    fn a_second_run_is_refused_while_the_lease_is_renewed() {
        let at = location("refused");
        let mut first = Lease::acquire(&at, 1, Duration::from_secs(30)).unwrap();
        first.renew().unwrap();
        let e = Lease::acquire(&at, 2, Duration::from_secs(30))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("checkpoints at memory://lease-refused/p are in use by another run"),
            "{e}"
        );
        assert!(
            e.contains(&format!("pid {} on host", std::process::id())),
            "{e}"
        );
        first.release();
        assert!(!at.exists(LEASE).unwrap(), "a clean exit removes it");
        Lease::acquire(&at, 2, Duration::from_secs(30)).unwrap();
    }

    #[test]
    fn a_stale_lease_is_taken_over_and_its_holder_learns_it_lost() {
        let at = location("stale");
        let mut old = Lease::acquire(&at, 1, Duration::from_millis(300)).unwrap();
        std::thread::sleep(Duration::from_millis(350));
        let mut new = Lease::acquire(&at, 2, Duration::from_secs(30)).unwrap();
        match old.renew() {
            Err(Renewal::Lost(e)) => assert!(e.to_string().contains("lost its lease"), "{e}"),
            other => panic!("{other:?}"),
        }
        new.renew().unwrap();
        // The loser's release leaves the winner's lease alone.
        old.release();
        assert_eq!(
            serde_json::from_slice::<Owner>(&at.get(LEASE).unwrap().unwrap())
                .unwrap()
                .generation,
            2
        );
    }

    #[test]
    fn a_lease_of_a_process_gone_from_this_host_is_taken_over_at_once() {
        let at = location("gone");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let dead = Owner {
            pid,
            ..Owner::me(1, Duration::from_secs(600))
        };
        assert!(dead.stale(now_ms()).is_some());
        at.put(LEASE, dead.to_bytes()).unwrap();
        let lease = Lease::acquire(&at, 2, Duration::from_secs(30)).unwrap();
        assert_eq!(lease.owner().pid, std::process::id());
        // A live one on this host is not.
        let live = Owner::me(3, Duration::from_secs(600));
        assert!(!live.process.is_empty());
        assert_eq!(live.stale(now_ms()), None);
        // An earlier process that had this one's pid (a restarted container) is gone.
        let earlier = Owner {
            process: format!("{}-earlier", live.process),
            ..live
        };
        assert!(earlier.stale(now_ms()).is_some());
    }

    #[test]
    fn two_takers_of_one_stale_lease_cannot_both_win() {
        let at = location("race");
        let stale = Owner {
            host: "elsewhere".into(),
            renewed_ms: 0,
            ..Owner::me(1, Duration::from_secs(1))
        };
        at.put(LEASE, stale.to_bytes()).unwrap();
        let (_, seen) = at.get_versioned(LEASE).unwrap().unwrap();
        // Another run takes it over between this one's read and its update.
        let other = Lease::acquire(&at, 2, Duration::from_secs(30)).unwrap();
        let me = Owner::me(3, Duration::from_secs(30));
        assert_eq!(at.put_if_match(LEASE, me.to_bytes(), &seen).unwrap(), None);
        let e = Lease::acquire(&at, 3, Duration::from_secs(30)).unwrap_err();
        assert!(e.to_string().contains("(run 2)"), "{e}");
        drop(other);
    }

    #[test]
    fn a_renewal_whose_answer_was_lost_is_recognised_as_its_own() {
        let at = location("lost-answer");
        let mut lease = Lease::acquire(&at, 1, Duration::from_secs(30)).unwrap();
        // The store applied a renewal whose answer never came back.
        let mut applied = lease.owner().clone();
        applied.renewed_ms += 1;
        at.put(LEASE, applied.to_bytes()).unwrap();
        lease.renew().unwrap();
        lease.renew().unwrap();
    }
}
