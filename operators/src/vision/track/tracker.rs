//! One camera's ByteTrack-style tracker, without Arrow: frames of detections in, a track id
//! per detection out. Its whole state is [`CameraTracks`], checkpointed as JSON.
//!
//! Per frame: Kalman-predict every confirmed and lost track; match them to the high-score
//! detections (IoU × score, linear assignment); match the tracks still unmatched to the
//! low-score detections (IoU), which continue tracks but never start one; match the
//! unconfirmed tracks (started last frame) to the remaining high-score detections, confirming
//! them; start unconfirmed tracks from what is left above `new_track_threshold`; drop tracks
//! lost for more than `track_buffer` frames.

use pathfinding::kuhn_munkres::kuhn_munkres;
use pathfinding::matrix::Matrix;
use serde::{Deserialize, Serialize};

use super::kalman::{self, Covariance, Mean};

/// The tracker's tuning (the stage's configuration).
#[derive(Clone, Debug)]
pub struct Params {
    pub high_threshold: f32,
    pub low_threshold: f32,
    pub new_track_threshold: f32,
    /// Least IoU × score for the first association.
    pub match_iou: f64,
    /// Frames a lost track is kept.
    pub track_buffer: i64,
    /// Tracks only match detections of their class.
    pub class_aware: bool,
}

/// Least IoU in the second (low-score) association: ByteTrack's cost threshold 0.5.
const SECOND_MATCH_IOU: f64 = 0.5;
/// Least IoU × score for confirming a track: ByteTrack's cost threshold 0.7.
const CONFIRM_MATCH_IOU: f64 = 0.3;
/// A lost track overlapping a tracked one by more than this is the same object twice.
const DUPLICATE_IOU: f64 = 0.85;
/// Similarities become integer weights for `kuhn_munkres` at this resolution.
const WEIGHT_SCALE: f64 = 1e6;
/// Every admissible pair is worth this much more than none, so that near-threshold pairs are
/// still matched when nothing better competes for them.
const PAIR_BONUS: f64 = 1e-4;

/// One detection of a frame, in source pixels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Detection {
    pub rect: [f32; 4],
    pub score: f32,
    pub class_id: i64,
}

/// One camera's tracks and id counter.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CameraTracks {
    /// The last frame processed (`None`: none yet, the next one is the camera's first).
    pub last_frame: Option<i64>,
    /// The last track id given; ids start at 1.
    pub last_id: i64,
    /// Tracks matched in the last frame, confirmed or not.
    pub tracked: Vec<Track>,
    /// Confirmed tracks not matched in the last frame, kept `track_buffer` frames.
    pub lost: Vec<Track>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Track {
    /// `None` until confirmed: matched again in the frame after it started (or started on
    /// the camera's first frame).
    pub id: Option<i64>,
    pub mean: Mean,
    pub covariance: Covariance,
    pub class_id: i64,
    pub start_frame: i64,
    /// The last frame it was matched in.
    pub last_seen: i64,
}

impl Track {
    fn rect(&self) -> [f64; 4] {
        kalman::rect(&self.mean)
    }

    /// Corrects the track with detection `d` seen in `frame`.
    fn update(&mut self, d: &Detection, frame: i64) {
        let z = kalman::measure(d.rect);
        if kalman::update(&mut self.mean, &mut self.covariance, z).is_none() {
            // A filter that went degenerate restarts at the measurement, keeping the id.
            (self.mean, self.covariance) = kalman::initiate(z);
        }
        self.class_id = d.class_id;
        self.last_seen = frame;
    }
}

/// Where a track of the association pool comes from.
#[derive(Clone, Copy)]
enum Slot {
    Tracked(usize),
    Lost(usize),
}

impl CameraTracks {
    /// Tracks `detections` of `frame` (which must follow the last frame); returns each
    /// detection's track id (`None`: not on a confirmed track). Missing frame numbers are
    /// processed as frames without detections, so tracks coast and age through the gap.
    pub fn step(&mut self, frame: i64, detections: &[Detection], p: &Params) -> Vec<Option<i64>> {
        if let Some(last) = self.last_frame {
            let missing = frame.saturating_sub(last).saturating_sub(1);
            // Beyond `track_buffer + 2` empty frames every track is gone: no need to replay more.
            let replay = missing.clamp(0, p.track_buffer.saturating_add(2));
            for f in frame - replay..frame {
                self.advance(f, &[], p);
            }
        }
        self.advance(frame, detections, p)
    }

    /// One frame: predict, the three associations, new tracks, the lists for the next frame.
    fn advance(&mut self, frame: i64, dets: &[Detection], p: &Params) -> Vec<Option<i64>> {
        let first_frame = self.last_frame.is_none();
        self.last_frame = Some(frame);
        let (high, low) = by_score(dets, p);
        let mut round = Round::new(
            frame,
            dets,
            std::mem::take(&mut self.tracked),
            std::mem::take(&mut self.lost),
        );
        let pool = round.predict();
        let (pool_matched, high_matched) = round.match_high(&pool, &high, p);
        let newly_lost = round.match_low(&pool, &pool_matched, &low, p);
        let left = unmatched(&high, &high_matched);
        let left_matched = round.confirm(&left, p, &mut self.last_id);
        let started = self.start(&left, &left_matched, dets, frame, first_frame, p);
        let (next, next_lost) = round.next_lists(started, &newly_lost, p.track_buffer);

        let mut ids = vec![None; dets.len()];
        for (t, d) in &next {
            if let (Some(&d), Some(id)) = (d.as_ref(), t.id) {
                if let Some(slot) = ids.get_mut(d) {
                    *slot = Some(id);
                }
            }
        }
        self.tracked = next.into_iter().map(|(t, _)| t).collect();
        self.lost = next_lost;
        ids
    }

    /// Step 4: new tracks from the high-score detections nobody took (`left`, `matched` beside it),
    /// confirmed at once on a camera's first frame (nothing to confirm against).
    fn start(
        &mut self,
        left: &[usize],
        matched: &[bool],
        dets: &[Detection],
        frame: i64,
        first_frame: bool,
        p: &Params,
    ) -> Vec<(Track, usize)> {
        let mut started = Vec::new();
        for (&d, &matched) in left.iter().zip(matched) {
            let Some(det) = dets.get(d) else { continue };
            if matched || det.score < p.new_track_threshold {
                continue;
            }
            let (mean, covariance) = kalman::initiate(kalman::measure(det.rect));
            let id = first_frame.then(|| {
                self.last_id += 1;
                self.last_id
            });
            let track = Track {
                id,
                mean,
                covariance,
                class_id: det.class_id,
                start_frame: frame,
                last_seen: frame,
            };
            started.push((track, d));
        }
        started
    }
}

/// The high- and low-score detections (indices into `dets`). Boxes without area cannot be
/// tracked (aspect = w / h): they are in neither and keep a null id.
fn by_score(dets: &[Detection], p: &Params) -> (Vec<usize>, Vec<usize>) {
    let usable = |d: &Detection| d.rect[2] > d.rect[0] && d.rect[3] > d.rect[1];
    let pick = |keep: &dyn Fn(f32) -> bool| -> Vec<usize> {
        dets.iter()
            .enumerate()
            .filter(|(_, d)| usable(d) && keep(d.score))
            .map(|(i, _)| i)
            .collect()
    };
    (
        pick(&|s| s >= p.high_threshold),
        pick(&|s| s >= p.low_threshold && s < p.high_threshold),
    )
}

/// The items of `of` whose flag beside them is false.
fn unmatched(of: &[usize], matched: &[bool]) -> Vec<usize> {
    of.iter()
        .zip(matched)
        .filter(|&(_, &m)| !m)
        .map(|(&d, _)| d)
        .collect()
}

/// One frame's associations: the tracks as they came in and which detection each took.
struct Round<'a> {
    frame: i64,
    dets: &'a [Detection],
    tracked: Vec<Track>,
    lost: Vec<Track>,
    tracked_hit: Vec<Option<usize>>,
    lost_hit: Vec<Option<usize>>,
    /// Lost tracks matched again, in the order they were.
    refound: Vec<usize>,
}

#[allow(
    clippy::indexing_slicing,
    reason = "a `Slot` or a hit list indexes `tracked` or `lost`, enumerated from them (the hit \
              lists and slot lists have their lengths); `assign` returns (row, column) pairs \
              within `sim`, whose rows are `pool`/`remaining`/`unconfirmed` and columns \
              `high`/`low`/`left`; those hold indices enumerated from `dets`"
)]
impl<'a> Round<'a> {
    fn new(frame: i64, dets: &'a [Detection], tracked: Vec<Track>, lost: Vec<Track>) -> Self {
        Round {
            frame,
            dets,
            tracked_hit: vec![None; tracked.len()],
            lost_hit: vec![None; lost.len()],
            tracked,
            lost,
            refound: Vec::new(),
        }
    }

    /// Kalman-predicts the pool (confirmed and lost tracks; unconfirmed ones are matched
    /// last) and returns it.
    fn predict(&mut self) -> Vec<Slot> {
        let pool: Vec<Slot> = self
            .tracked
            .iter()
            .enumerate()
            .filter(|(_, t)| t.id.is_some())
            .map(|(i, _)| Slot::Tracked(i))
            .chain((0..self.lost.len()).map(Slot::Lost))
            .collect();
        for t in self.tracked.iter_mut().filter(|t| t.id.is_some()) {
            kalman::predict(&mut t.mean, &mut t.covariance);
        }
        for t in &mut self.lost {
            // A lost track keeps drifting but stops growing or shrinking.
            t.mean[7] = 0.0;
            kalman::predict(&mut t.mean, &mut t.covariance);
        }
        pool
    }

    fn track(&self, slot: Slot) -> &Track {
        match slot {
            Slot::Tracked(i) => &self.tracked[i],
            Slot::Lost(i) => &self.lost[i],
        }
    }

    /// Step 1: pool × high-score detections, IoU weighted by score. Which of the pool and of `high`
    /// were matched.
    fn match_high(&mut self, pool: &[Slot], high: &[usize], p: &Params) -> (Vec<bool>, Vec<bool>) {
        let sim = similarity(
            pool.iter().map(|&s| {
                let t = self.track(s);
                (t.rect(), t.class_id)
            }),
            high,
            self.dets,
            true,
            p.class_aware,
        );
        let mut pool_matched = vec![false; pool.len()];
        let mut high_matched = vec![false; high.len()];
        for (k, j) in assign(&sim, p.match_iou) {
            pool_matched[k] = true;
            high_matched[j] = true;
            let d = high[j];
            match pool[k] {
                Slot::Tracked(i) => {
                    self.tracked[i].update(&self.dets[d], self.frame);
                    self.tracked_hit[i] = Some(d);
                }
                Slot::Lost(i) => {
                    self.lost[i].update(&self.dets[d], self.frame);
                    self.lost_hit[i] = Some(d);
                    self.refound.push(i);
                }
            }
        }
        (pool_matched, high_matched)
    }

    /// Step 2: tracked tracks still unmatched × low-score detections, plain IoU. Returns those
    /// still unmatched: lost from now on.
    fn match_low(
        &mut self,
        pool: &[Slot],
        pool_matched: &[bool],
        low: &[usize],
        p: &Params,
    ) -> Vec<usize> {
        let remaining: Vec<usize> = pool
            .iter()
            .zip(pool_matched)
            .filter(|&(_, &matched)| !matched)
            .filter_map(|(s, _)| match *s {
                Slot::Tracked(i) => Some(i),
                Slot::Lost(_) => None,
            })
            .collect();
        let sim = self.similarity_of(&remaining, low, false, p);
        let mut second_matched = vec![false; remaining.len()];
        for (k, j) in assign(&sim, SECOND_MATCH_IOU) {
            second_matched[k] = true;
            let i = remaining[k];
            self.tracked[i].update(&self.dets[low[j]], self.frame);
            self.tracked_hit[i] = Some(low[j]);
        }
        unmatched(&remaining, &second_matched)
    }

    /// Step 3: unconfirmed tracks × the high-score detections `left`: a match confirms the track
    /// (its id the next of `last_id`). Which of `left` were matched.
    fn confirm(&mut self, left: &[usize], p: &Params, last_id: &mut i64) -> Vec<bool> {
        let unconfirmed: Vec<usize> = self
            .tracked
            .iter()
            .enumerate()
            .filter(|(_, t)| t.id.is_none())
            .map(|(i, _)| i)
            .collect();
        let sim = self.similarity_of(&unconfirmed, left, true, p);
        let mut left_matched = vec![false; left.len()];
        for (k, j) in assign(&sim, CONFIRM_MATCH_IOU) {
            left_matched[j] = true;
            let i = unconfirmed[k];
            self.tracked[i].update(&self.dets[left[j]], self.frame);
            self.tracked_hit[i] = Some(left[j]);
            *last_id += 1;
            self.tracked[i].id = Some(*last_id);
        }
        left_matched
    }

    /// Tracked tracks `rows` × detections `columns`.
    fn similarity_of(
        &self,
        rows: &[usize],
        columns: &[usize],
        weighted: bool,
        p: &Params,
    ) -> Vec<Vec<f64>> {
        similarity(
            rows.iter()
                .map(|&i| (self.tracked[i].rect(), self.tracked[i].class_id)),
            columns,
            self.dets,
            weighted,
            p.class_aware,
        )
    }

    /// Step 5: the lists for the next frame, in a stable order: surviving tracked tracks, new
    /// ones, re-found ones; then lost ones still within the buffer, newly lost ones. Each
    /// tracked one with the detection it took.
    fn next_lists(
        self,
        started: Vec<(Track, usize)>,
        newly_lost: &[usize],
        track_buffer: i64,
    ) -> (Vec<(Track, Option<usize>)>, Vec<Track>) {
        let mut next: Vec<(Track, Option<usize>)> = Vec::new();
        let mut next_lost: Vec<Track> = Vec::new();
        let mut tracked_slots: Vec<Option<Track>> = self.tracked.into_iter().map(Some).collect();
        let mut lost_slots: Vec<Option<Track>> = self.lost.into_iter().map(Some).collect();
        for (slot, &hit) in tracked_slots.iter_mut().zip(&self.tracked_hit) {
            // Matched tracks stay (unmatched unconfirmed ones are dropped here).
            if hit.is_some() {
                if let Some(t) = slot.take() {
                    next.push((t, hit));
                }
            }
        }
        next.extend(started.into_iter().map(|(t, d)| (t, Some(d))));
        for &i in &self.refound {
            if let Some(t) = lost_slots[i].take() {
                next.push((t, self.lost_hit[i]));
            }
        }
        for t in lost_slots.into_iter().flatten() {
            if self.frame - t.last_seen <= track_buffer {
                next_lost.push(t);
            }
        }
        for &i in newly_lost {
            if let Some(t) = tracked_slots[i].take() {
                next_lost.push(t);
            }
        }
        drop_duplicates(next, next_lost)
    }
}

/// A tracked and a lost track on the same object: the one tracked for less long goes.
fn drop_duplicates(
    tracked: Vec<(Track, Option<usize>)>,
    lost: Vec<Track>,
) -> (Vec<(Track, Option<usize>)>, Vec<Track>) {
    let mut drop_tracked = vec![false; tracked.len()];
    let mut drop_lost = vec![false; lost.len()];
    for ((a, _), drop_a) in tracked.iter().zip(&mut drop_tracked) {
        for (b, drop_b) in lost.iter().zip(&mut drop_lost) {
            if iou(&a.rect(), &b.rect()) > DUPLICATE_IOU {
                let (age_a, age_b) = (a.last_seen - a.start_frame, b.last_seen - b.start_frame);
                if age_a > age_b {
                    *drop_b = true;
                } else {
                    *drop_a = true;
                }
            }
        }
    }
    let tracked = tracked
        .into_iter()
        .zip(drop_tracked)
        .filter_map(|(t, d)| (!d).then_some(t))
        .collect();
    let lost = lost
        .into_iter()
        .zip(drop_lost)
        .filter_map(|(t, d)| (!d).then_some(t))
        .collect();
    (tracked, lost)
}

/// Track × detection similarity: IoU, times the detection's score when `fuse_score`; zero
/// across classes when `class_aware`. One row per track, one column per index of `columns`.
#[allow(
    clippy::indexing_slicing,
    reason = "`columns` holds indices of `dets`, which `advance` enumerated from it"
)]
fn similarity(
    tracks: impl Iterator<Item = ([f64; 4], i64)>,
    columns: &[usize],
    dets: &[Detection],
    fuse_score: bool,
    class_aware: bool,
) -> Vec<Vec<f64>> {
    tracks
        .map(|(rect, class)| {
            columns
                .iter()
                .map(|&d| {
                    let det = &dets[d];
                    if class_aware && det.class_id != class {
                        return 0.0;
                    }
                    let overlap = iou(&rect, &det.rect.map(f64::from));
                    if fuse_score {
                        overlap * f64::from(det.score)
                    } else {
                        overlap
                    }
                })
                .collect()
        })
        .collect()
}

/// The (row, column) pairs of a maximum-weight matching among pairs with similarity at least
/// `min` (each row and column used once). `sim` is rectangular, as [`similarity`] makes it.
fn assign(sim: &[Vec<f64>], min: f64) -> Vec<(usize, usize)> {
    let rows = sim.len();
    let columns = sim.first().map_or(0, Vec::len);
    if rows == 0 || columns == 0 {
        return Vec::new();
    }
    let admissible = |r: usize, c: usize| -> Option<f64> {
        sim.get(r)
            .and_then(|row| row.get(c))
            .copied()
            .filter(|&s| s >= min)
    };
    let weight = |r: usize, c: usize| -> i64 {
        admissible(r, c).map_or(0, |s| {
            ((s - min + PAIR_BONUS) * WEIGHT_SCALE).round() as i64
        })
    };
    // kuhn_munkres needs no more rows than columns.
    let transposed = rows > columns;
    let (n, m) = if transposed {
        (columns, rows)
    } else {
        (rows, columns)
    };
    let weights = Matrix::from_fn(n, m, |(a, b)| {
        if transposed {
            weight(b, a)
        } else {
            weight(a, b)
        }
    });
    let (_, chosen) = kuhn_munkres(&weights);
    let mut pairs: Vec<(usize, usize)> = chosen
        .into_iter()
        .enumerate()
        .map(|(a, b)| if transposed { (b, a) } else { (a, b) })
        .filter(|&(r, c)| admissible(r, c).is_some())
        .collect();
    pairs.sort_unstable();
    pairs
}

/// Intersection over union of two `[x1, y1, x2, y2]` boxes; 0 when the union is empty.
pub fn iou(a: &[f64; 4], b: &[f64; 4]) -> f64 {
    let w = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let h = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = w * h;
    let area = |r: &[f64; 4]| (r[2] - r[0]).max(0.0) * (r[3] - r[1]).max(0.0);
    let union = area(a) + area(b) - inter;
    if union > 0.0 {
        inter / union
    } else {
        0.0
    }
}
