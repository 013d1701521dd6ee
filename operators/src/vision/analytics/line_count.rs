//! `line_count`: tracks crossing counting lines, per camera, with running totals.
//!
//! Output columns, added to every frame row:
//! - `line_events`: `List<Struct{line: Utf8, track_id: Int64, class_id: Int64, direction:
//!   Utf8}>`, the crossings at this frame (`in` or `out`);
//! - `line_totals`: `List<Struct{line: Utf8, class_id: Int64, in: Int64, out: Int64}>`, the
//!   crossings of this camera so far (in the current window with `window_frames`), per line (in
//!   configuration order) and class (ascending); a line or class with no crossing yet has no entry.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Fields, SchemaRef};
use riffle_dataflow::runtime::Step;
use riffle_dataflow::{DataflowError, DataflowResult, StageOutput};
use serde::{Deserialize, Serialize};
use serde_inline_default::serde_inline_default;

use super::{
    check_common, crosses, each_row, extend_schema, finite_point, frame_order, int64_column,
    kept_with, list_field, side, Anchor, DetectionsColumn, ListColumn, Object,
};
use riffle_dataflow::operators::{Keyed, KeyedLogic};

const NAME: &str = "line_count";
const EVENTS: &str = "line_events";
const TOTALS: &str = "line_totals";

/// One counting line, in pixels of the source image.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LineConfig {
    /// Shown in the events and totals; unique among the stage's lines.
    pub name: String,
    pub from: [f32; 2],
    pub to: [f32; 2],
}

/// YAML block of a `line_count` stage.
#[serde_inline_default]
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LineCountConfig {
    /// The segments counted. Crossing from the left of a line to its right, as seen walking from
    /// `from` to `to` on the image (y pointing down), is `in`; the other way is `out`.
    pub lines: Vec<LineConfig>,
    #[serde(default)]
    pub anchor: Anchor,
    /// Class ids counted; empty counts every class.
    #[serde(default)]
    pub classes: Vec<i64>,
    /// Totals restart at every frame that is a multiple of this (frames `k·N .. (k+1)·N - 1`
    /// form window `k`); unset: totals since the start.
    #[serde(default)]
    pub window_frames: Option<i64>,
    /// A track unseen for this many frames is forgotten (the tracker has dropped it by then).
    #[serde_inline_default(30)]
    pub forget_after_frames: i64,
    /// The tracked detections list column.
    #[serde_inline_default("detections".to_string())]
    pub detections: String,
    /// The column whose values each have their own state (a Utf8 or Int64 column).
    #[serde_inline_default("camera_id".to_string())]
    pub key: String,
    /// The Int64 frame-number column.
    #[serde_inline_default("frame".to_string())]
    pub frame: String,
}

/// What one camera's counting remembers (checkpointed as JSON).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LineState {
    /// The last frame processed.
    pub last_frame: Option<i64>,
    /// The window the totals belong to (with `window_frames`).
    pub window: Option<i64>,
    /// Per track id: where it was.
    pub tracks: BTreeMap<i64, TrackMemory>,
    /// Per line, per class: `[in, out]`.
    pub totals: BTreeMap<String, BTreeMap<i64, [i64; 2]>>,
}

/// Where a track was.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrackMemory {
    /// The frame it was last seen at.
    pub seen: i64,
    /// Per line, its last anchor not on that line: an anchor landing exactly on a line neither
    /// counts nor replaces it, so touching a line and going back is no crossing.
    pub anchors: BTreeMap<String, [f32; 2]>,
}

/// One crossing.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Crossing {
    /// The line's name.
    line: String,
    track_id: i64,
    class_id: i64,
    inward: bool,
}

/// The `line_count` logic, one camera at a time (run by [`Keyed`]).
///
/// # Examples
/// One camera, a horizontal line at y = 100 drawn left to right: a track walking down across
/// it is `in`.
/// ```
/// use std::sync::Arc;
/// use arrow_array::cast::AsArray;
/// use arrow_array::types::Int64Type;
/// use arrow_array::{ArrayRef, Float32Array, Int64Array, ListArray, RecordBatch, StringArray, StructArray};
/// use arrow_buffer::OffsetBuffer;
/// use arrow_schema::{DataType, Field, Fields};
/// use riffle_operators::vision::analytics::line_count::{LineCount, LineState};
/// use riffle_dataflow::operators::KeyedLogic;
///
/// // Frames 0 and 1 of camera `gate`, one person (track 7) whose feet go from y = 90 to 110.
/// let f32s = |v: [f32; 2]| Arc::new(Float32Array::from(v.to_vec())) as ArrayRef;
/// let fields = Fields::from(vec![
///     Field::new("class_id", DataType::Int64, false),
///     Field::new("score", DataType::Float32, false),
///     Field::new("x1", DataType::Float32, false),
///     Field::new("y1", DataType::Float32, false),
///     Field::new("x2", DataType::Float32, false),
///     Field::new("y2", DataType::Float32, false),
///     Field::new("track_id", DataType::Int64, true),
/// ]);
/// let boxes = StructArray::new(fields.clone(), vec![
///     Arc::new(Int64Array::from(vec![1, 1])),
///     f32s([0.9, 0.9]),
///     f32s([40.0, 40.0]), f32s([30.0, 50.0]), f32s([60.0, 60.0]), f32s([90.0, 110.0]),
///     Arc::new(Int64Array::from(vec![7, 7])),
/// ], None);
/// let item = Arc::new(Field::new_list_field(DataType::Struct(fields), false));
/// let detections = ListArray::new(item, OffsetBuffer::from_lengths([1, 1]), Arc::new(boxes), None);
/// let batch = RecordBatch::try_from_iter([
///     ("camera_id", Arc::new(StringArray::from(vec!["gate", "gate"])) as ArrayRef),
///     ("frame", Arc::new(Int64Array::from(vec![0, 1])) as _),
///     ("detections", Arc::new(detections) as _),
/// ])
/// .unwrap();
///
/// let config = serde_json::json!({ "lines": [{ "name": "door", "from": [0, 100], "to": [200, 100] }] });
/// let mut logic = LineCount::new(serde_json::from_value(config).unwrap()).unwrap();
/// let mut state = LineState::default();
/// let out = logic.process("gate", &mut state, &batch).unwrap().records;
///
/// // No crossing at frame 0, one `in` at frame 1; totals run on.
/// let events = out.column_by_name("line_events").unwrap().as_list::<i32>();
/// assert_eq!(events.value(0).len(), 0);
/// let crossing = events.value(1);
/// let crossing = crossing.as_struct();
/// assert_eq!(crossing.column_by_name("direction").unwrap().as_string::<i32>().value(0), "in");
/// assert_eq!(crossing.column_by_name("track_id").unwrap().as_primitive::<Int64Type>().value(0), 7);
/// let totals = out.column_by_name("line_totals").unwrap().as_list::<i32>().value(1);
/// let count = |c: &str| totals.as_struct().column_by_name(c).unwrap().as_primitive::<Int64Type>().value(0);
/// assert_eq!((count("in"), count("out")), (1, 0));
/// // The state (checkpointed per camera) holds the totals.
/// assert_eq!(state.totals["door"][&1], [1, 0]);
/// ```
#[derive(Debug)]
pub struct LineCount {
    config: LineCountConfig,
}

impl LineCount {
    /// The logic, after checking the configuration (errors at their keys).
    pub fn new(config: LineCountConfig) -> DataflowResult<Self> {
        let bad =
            |key: String, msg: String| Err(DataflowError::Config(format!("{NAME}: {msg}")).at(key));
        if config.lines.is_empty() {
            return bad("lines".into(), "at least one line is needed".into());
        }
        for (i, line) in config.lines.iter().enumerate() {
            if line.name.is_empty() {
                return bad(format!("lines[{i}].name"), "a line needs a name".into());
            }
            if config.lines.iter().take(i).any(|l| l.name == line.name) {
                return bad(
                    format!("lines[{i}].name"),
                    format!("line name `{}` is used twice", line.name),
                );
            }
            finite_point(line.from, NAME, &format!("lines[{i}].from"))?;
            finite_point(line.to, NAME, &format!("lines[{i}].to"))?;
            if line.from == line.to {
                return bad(
                    format!("lines[{i}].to"),
                    format!("line `{}` has no length (`from` = `to`)", line.name),
                );
            }
        }
        if config.window_frames.is_some_and(|n| n < 1) {
            return bad("window_frames".into(), "must be at least 1".into());
        }
        if config.forget_after_frames < 1 {
            return bad("forget_after_frames".into(), "must be at least 1".into());
        }
        Ok(LineCount { config })
    }

    /// The output schema for `input`.
    pub fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        let c = &self.config;
        check_common(input, &c.detections, &c.key, &c.frame)?;
        extend_schema(
            input,
            vec![
                list_field(EVENTS, event_fields()),
                list_field(TOTALS, total_fields()),
            ],
        )
    }

    /// One checked row's objects into `state`: its crossings.
    fn count(&self, state: &mut LineState, frame: i64, objects: &[Object]) -> Vec<Crossing> {
        let c = &self.config;
        if let Some(n) = c.window_frames {
            let window = frame.div_euclid(n);
            if state.window != Some(window) {
                state.totals.clear();
                state.window = Some(window);
            }
        }
        state.last_frame = Some(frame);
        // Lines no longer configured (a checkpoint from an older configuration) are dropped.
        state
            .totals
            .retain(|name, _| c.lines.iter().any(|l| &l.name == name));
        // Before this frame's objects, so a track back after too long starts afresh.
        let forget = c.forget_after_frames;
        state
            .tracks
            .retain(|_, m| frame.saturating_sub(m.seen) < forget);
        let mut crossings = Vec::new();
        for object in objects {
            // Without an id a box cannot be followed from frame to frame.
            let Some(track_id) = object.track_id else {
                continue;
            };
            if !c.classes.is_empty() && !c.classes.contains(&object.class_id) {
                continue;
            }
            let at = c.anchor.of(object.rect);
            let memory = state.tracks.entry(track_id).or_default();
            memory.seen = frame;
            for line in &c.lines {
                let now = side(line.from, line.to, at);
                if now == 0.0 {
                    continue;
                }
                if let Some(&before) = memory.anchors.get(&line.name) {
                    if crosses(before, at, line.from, line.to) {
                        let inward = now > 0.0;
                        crossings.push(Crossing {
                            line: line.name.clone(),
                            track_id,
                            class_id: object.class_id,
                            inward,
                        });
                        let counts = state
                            .totals
                            .entry(line.name.clone())
                            .or_default()
                            .entry(object.class_id)
                            .or_default();
                        let [count_in, count_out] = counts;
                        if inward {
                            *count_in += 1;
                        } else {
                            *count_out += 1;
                        }
                    }
                }
                memory.anchors.insert(line.name.clone(), at);
            }
        }
        crossings
    }
}

fn event_fields() -> Fields {
    Fields::from(vec![
        Field::new("line", DataType::Utf8, false),
        Field::new("track_id", DataType::Int64, false),
        Field::new("class_id", DataType::Int64, false),
        Field::new("direction", DataType::Utf8, false),
    ])
}

fn total_fields() -> Fields {
    Fields::from(vec![
        Field::new("line", DataType::Utf8, false),
        Field::new("class_id", DataType::Int64, false),
        Field::new("in", DataType::Int64, false),
        Field::new("out", DataType::Int64, false),
    ])
}

/// The two output columns, built row by row.
struct Columns {
    events: ListColumn,
    event_line: Vec<String>,
    event_track: Vec<i64>,
    event_class: Vec<i64>,
    direction: Vec<&'static str>,
    totals: ListColumn,
    total_line: Vec<String>,
    total_class: Vec<i64>,
    total_in: Vec<i64>,
    total_out: Vec<i64>,
}

impl Columns {
    fn new(rows: usize) -> Self {
        Columns {
            events: ListColumn::new(event_fields(), rows),
            event_line: Vec::new(),
            event_track: Vec::new(),
            event_class: Vec::new(),
            direction: Vec::new(),
            totals: ListColumn::new(total_fields(), rows),
            total_line: Vec::new(),
            total_class: Vec::new(),
            total_in: Vec::new(),
            total_out: Vec::new(),
        }
    }

    fn push(&mut self, lines: &[LineConfig], crossings: &[Crossing], state: &LineState) {
        for c in crossings {
            self.event_line.push(c.line.clone());
            self.event_track.push(c.track_id);
            self.event_class.push(c.class_id);
            self.direction.push(if c.inward { "in" } else { "out" });
        }
        self.events.row(crossings.len());
        let before = self.total_line.len();
        for line in lines {
            for (class, [i, o]) in state.totals.get(&line.name).into_iter().flatten() {
                self.total_line.push(line.name.clone());
                self.total_class.push(*class);
                self.total_in.push(*i);
                self.total_out.push(*o);
            }
        }
        self.totals.row(self.total_line.len() - before);
    }

    fn finish(self) -> DataflowResult<Vec<ArrayRef>> {
        let events = self.events.finish(vec![
            Arc::new(StringArray::from(self.event_line)),
            Arc::new(Int64Array::from(self.event_track)),
            Arc::new(Int64Array::from(self.event_class)),
            Arc::new(StringArray::from(self.direction)),
        ])?;
        let totals = self.totals.finish(vec![
            Arc::new(StringArray::from(self.total_line)),
            Arc::new(Int64Array::from(self.total_class)),
            Arc::new(Int64Array::from(self.total_in)),
            Arc::new(Int64Array::from(self.total_out)),
        ])?;
        Ok(vec![events, totals])
    }
}

impl KeyedLogic for LineCount {
    type State = LineState;

    fn name(&self) -> &str {
        NAME
    }

    fn process(
        &mut self,
        _key: &str,
        state: &mut LineState,
        rows: &RecordBatch,
    ) -> DataflowResult<StageOutput> {
        let schema = self.output_schema(rows.schema_ref())?;
        let detections = DetectionsColumn::new(rows, &self.config.detections, true)?;
        let frames = int64_column(rows, &self.config.frame)?;
        let mut columns = Columns::new(rows.num_rows());
        let (keep, rejected) = each_row(rows, NAME, |row| {
            let frame = frames.is_valid(row).then(|| frames.value(row));
            // Checked before anything changes, so a bad row leaves the state as it was.
            let frame = frame_order(frame, state.last_frame)?;
            let objects = detections.row(row)?;
            let crossings = self.count(state, frame, &objects);
            columns.push(&self.config.lines, &crossings, state);
            Ok(())
        });
        let records = kept_with(rows, keep, schema, columns.finish()?)?;
        Ok(StageOutput { records, rejected })
    }
}

impl crate::StageKind for LineCountConfig {
    fn kind(&self) -> &'static str {
        NAME
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        LineCount::new(self.clone())?.output_schema(input)
    }

    fn build(&self, _ctx: &crate::StageContext<'_>) -> DataflowResult<Step> {
        Ok(Step::Stateful(Box::new(Keyed {
            logic: LineCount::new(self.clone())?,
            key: self.key.clone(),
        })))
    }

    fn describe(&self, _ctx: &crate::StageContext<'_>) -> String {
        let window = self
            .window_frames
            .map_or("since the start".to_string(), |n| format!("per {n} frames"));
        format!(
            "rows sharded by `{}`; {} line(s), anchor {}; totals {window}",
            self.key,
            self.lines.len(),
            self.anchor.name()
        )
    }

    fn stateful(&self) -> bool {
        true
    }
}
