//! Reused float buffers for the CPU executor. A run's intermediate tensors go back to a pool of
//! this thread's when the run ends, and the next run's ops write into them: memory already
//! mapped, instead of fresh pages faulted in (and zeroed by the kernel) for every op of every
//! batch, which cost more than the arithmetic on batches of thousands of rows.

use std::cell::RefCell;

/// At most this many spare buffers a thread (a graph holds a few dozen values).
const KEEP: usize = 64;

thread_local! {
    static SPARE: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// An empty vector with room for `len` values: the smallest spare one that fits, else new.
pub(crate) fn take(len: usize) -> Vec<f32> {
    let spare = SPARE.with_borrow_mut(|spare| {
        let fit = spare
            .iter()
            .enumerate()
            .filter(|(_, v)| v.capacity() >= len)
            .min_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i)?;
        Some(spare.swap_remove(fit))
    });
    match spare {
        Some(mut v) => {
            v.clear();
            v
        }
        None => Vec::with_capacity(len),
    }
}

/// `len` zeros, in a buffer from [`take`].
pub(crate) fn zeros(len: usize) -> Vec<f32> {
    let mut v = take(len);
    v.resize(len, 0.0);
    v
}

/// Returns a buffer to the pool (dropped when the pool is full).
pub(crate) fn give(v: Vec<f32>) {
    if v.capacity() == 0 {
        return;
    }
    SPARE.with_borrow_mut(|spare| {
        if spare.len() < KEEP {
            spare.push(v);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_returned_buffer_is_reused_for_a_size_it_fits_and_comes_back_empty() {
        let mut v = take(1000);
        v.extend(std::iter::repeat_n(1.0, 1000));
        let at = v.as_ptr();
        give(v);
        let again = take(800);
        assert_eq!(
            again.as_ptr(),
            at,
            "the spare buffer serves a smaller request"
        );
        assert!(again.is_empty() && again.capacity() >= 1000);
        give(again);
        let bigger = take(5000);
        assert_ne!(bigger.as_ptr(), at, "too small a spare is not handed out");
        assert_eq!(zeros(3), vec![0.0; 3]);
    }
}
