//! `zone`: tracks entering and leaving polygons, per camera, with dwell times and occupancy.
//!
//! Output columns, added to every frame row:
//! - `zone_events`: `List<Struct{zone: Utf8, track_id: Int64, class_id: Int64, event: Utf8,
//!   dwell_frames: Int64?, dwell_ms: Int64?}>`, the entries (`enter`, dwell null) and exits
//!   (`exit`, with the time spent inside) at this frame: per zone in configuration order, exits
//!   before entries, by track id;
//! - `zone_occupancy`: `List<Struct{zone: Utf8, count: Int64}>`, the tracks inside each zone
//!   after this frame, one entry per zone.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};
use riffle_dataflow::runtime::Step;
use riffle_dataflow::{DataflowError, DataflowResult, StageOutput};
use serde::{Deserialize, Serialize};
use serde_inline_default::serde_inline_default;

use super::{
    check_column, check_common, each_row, extend_schema, finite_point, frame_order, inside,
    int64_column, kept_with, list_field, Anchor, DetectionsColumn, ListColumn, Object,
};
use riffle_dataflow::operators::{Keyed, KeyedLogic};

const NAME: &str = "zone";
const EVENTS: &str = "zone_events";
const OCCUPANCY: &str = "zone_occupancy";

/// One zone, in pixels of the source image.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZoneAreaConfig {
    /// Shown in the events and occupancy; unique among the stage's zones.
    pub name: String,
    /// At least three corners, in order (the last joins the first).
    pub polygon: Vec<[f32; 2]>,
}

/// YAML block of a `zone` stage.
#[serde_inline_default]
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZoneConfig {
    pub zones: Vec<ZoneAreaConfig>,
    #[serde(default)]
    pub anchor: Anchor,
    /// Class ids followed; empty follows every class.
    #[serde(default)]
    pub classes: Vec<i64>,
    /// Frames per second, for `dwell_ms` when the input has no `pts` column.
    #[serde_inline_default(25.0)]
    pub fps: f64,
    /// The Int64 presentation-time column (ms) giving `dwell_ms`, used when the input has it.
    #[serde_inline_default("pts_ms".to_string())]
    pub pts: String,
    /// A track inside a zone and unseen for this many frames exits it (lost by the tracker).
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

/// A frame and, when the input has one, its presentation time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moment {
    pub frame: i64,
    pub ms: Option<i64>,
}

/// A track inside a zone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stay {
    pub class_id: i64,
    pub entered: Moment,
    /// The last frame it was seen inside.
    pub seen: Moment,
}

/// What one camera's zones remember (checkpointed as JSON).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ZoneState {
    /// The last frame processed.
    pub last_frame: Option<i64>,
    /// Per zone, the tracks inside it.
    pub inside: BTreeMap<String, BTreeMap<i64, Stay>>,
}

/// One entry or exit.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ZoneEvent {
    /// The zone's name.
    zone: String,
    track_id: i64,
    class_id: i64,
    /// `None` for an entry; for an exit, the time inside in frames and ms.
    dwell: Option<(i64, i64)>,
}

/// The `zone` logic, one camera at a time (run by [`Keyed`]).
///
/// # Examples
/// A track walking into a square zone at frame 1 and out at frame 3, with `pts_ms`.
/// ```
/// use std::sync::Arc;
/// use arrow_array::cast::AsArray;
/// use arrow_array::types::Int64Type;
/// use arrow_array::{ArrayRef, Float32Array, Int64Array, ListArray, RecordBatch, StringArray, StructArray};
/// use arrow_buffer::OffsetBuffer;
/// use arrow_schema::{DataType, Field, Fields};
/// use riffle_operators::vision::analytics::zone::{Zone, ZoneState};
/// use riffle_dataflow::operators::KeyedLogic;
///
/// // Track 3's box centre moves along y = 50: x = 0, 50, 60, 150 (zone: x and y in 20..100).
/// let xs = [0.0f32, 50.0, 60.0, 150.0];
/// let f32s = |v: Vec<f32>| Arc::new(Float32Array::from(v)) as ArrayRef;
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
///     Arc::new(Int64Array::from(vec![1; 4])),
///     f32s(vec![0.9; 4]),
///     f32s(xs.iter().map(|x| x - 5.0).collect()),
///     f32s(vec![45.0; 4]),
///     f32s(xs.iter().map(|x| x + 5.0).collect()),
///     f32s(vec![55.0; 4]),
///     Arc::new(Int64Array::from(vec![3; 4])),
/// ], None);
/// let item = Arc::new(Field::new_list_field(DataType::Struct(fields), false));
/// let detections = ListArray::new(item, OffsetBuffer::from_lengths([1; 4]), Arc::new(boxes), None);
/// let batch = RecordBatch::try_from_iter([
///     ("camera_id", Arc::new(StringArray::from(vec!["lobby"; 4])) as ArrayRef),
///     ("frame", Arc::new(Int64Array::from(vec![0, 1, 2, 3])) as _),
///     ("pts_ms", Arc::new(Int64Array::from(vec![0, 40, 80, 120])) as _),
///     ("detections", Arc::new(detections) as _),
/// ])
/// .unwrap();
///
/// let config = serde_json::json!({
///     "zones": [{ "name": "desk", "polygon": [[20, 20], [100, 20], [100, 100], [20, 100]] }],
///     "anchor": "center",
/// });
/// let mut logic = Zone::new(serde_json::from_value(config).unwrap()).unwrap();
/// let out = logic.process("lobby", &mut ZoneState::default(), &batch).unwrap().records;
///
/// let events = out.column_by_name("zone_events").unwrap().as_list::<i32>();
/// let event = |row: usize, column: &str| events.value(row).as_struct().column_by_name(column).unwrap().clone();
/// assert_eq!(event(1, "event").as_string::<i32>().value(0), "enter");
/// assert_eq!(event(3, "event").as_string::<i32>().value(0), "exit");
/// assert_eq!(event(3, "dwell_frames").as_primitive::<Int64Type>().value(0), 2);
/// assert_eq!(event(3, "dwell_ms").as_primitive::<Int64Type>().value(0), 80);
/// let occupancy = out.column_by_name("zone_occupancy").unwrap().as_list::<i32>();
/// let count = |row: usize| occupancy.value(row).as_struct().column_by_name("count").unwrap()
///     .as_primitive::<Int64Type>().value(0);
/// assert_eq!([count(0), count(1), count(2), count(3)], [0, 1, 1, 0]);
/// ```
#[derive(Debug)]
pub struct Zone {
    config: ZoneConfig,
}

impl Zone {
    /// The logic, after checking the configuration (errors at their keys).
    pub fn new(config: ZoneConfig) -> DataflowResult<Self> {
        let bad =
            |key: String, msg: String| Err(DataflowError::Config(format!("{NAME}: {msg}")).at(key));
        if config.zones.is_empty() {
            return bad("zones".into(), "at least one zone is needed".into());
        }
        for (i, zone) in config.zones.iter().enumerate() {
            if zone.name.is_empty() {
                return bad(format!("zones[{i}].name"), "a zone needs a name".into());
            }
            if config.zones.iter().take(i).any(|z| z.name == zone.name) {
                return bad(
                    format!("zones[{i}].name"),
                    format!("zone name `{}` is used twice", zone.name),
                );
            }
            if zone.polygon.len() < 3 {
                return bad(
                    format!("zones[{i}].polygon"),
                    format!(
                        "zone `{}` needs at least 3 corners, has {}",
                        zone.name,
                        zone.polygon.len()
                    ),
                );
            }
            for (j, p) in zone.polygon.iter().enumerate() {
                finite_point(*p, NAME, &format!("zones[{i}].polygon[{j}]"))?;
            }
        }
        if !(config.fps.is_finite() && config.fps > 0.0) {
            return bad(
                "fps".into(),
                format!("must be positive, got {}", config.fps),
            );
        }
        if config.forget_after_frames < 1 {
            return bad("forget_after_frames".into(), "must be at least 1".into());
        }
        Ok(Zone { config })
    }

    /// The output schema for `input`.
    pub fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        let c = &self.config;
        check_common(input, &c.detections, &c.key, &c.frame)?;
        if has_pts(input, &c.pts) {
            check_column(input, &c.pts, "Int64 milliseconds", &[DataType::Int64])
                .map_err(|e| e.at("pts"))?;
        }
        extend_schema(
            input,
            vec![
                list_field(EVENTS, event_fields()),
                list_field(OCCUPANCY, occupancy_fields()),
            ],
        )
    }

    /// Milliseconds between two moments: their presentation times when both have one, else
    /// the frames at `fps`.
    fn ms_between(&self, from: Moment, to: Moment) -> i64 {
        match (from.ms, to.ms) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => {
                let frames = to.frame.saturating_sub(from.frame) as f64;
                (frames * 1000.0 / self.config.fps).round() as i64
            }
        }
    }

    /// One checked row's objects into `state`: its entries and exits.
    fn update(&self, state: &mut ZoneState, now: Moment, objects: &[Object]) -> Vec<ZoneEvent> {
        let c = &self.config;
        state.last_frame = Some(now.frame);
        // Zones no longer configured (a checkpoint from an older configuration) are dropped.
        state
            .inside
            .retain(|name, _| c.zones.iter().any(|z| &z.name == name));
        // (track, class, anchor) of the tracks followed.
        let tracks: Vec<(i64, i64, [f32; 2])> = objects
            .iter()
            .filter(|o| c.classes.is_empty() || c.classes.contains(&o.class_id))
            .filter_map(|o| Some((o.track_id?, o.class_id, c.anchor.of(o.rect))))
            .collect();
        let seen: BTreeSet<i64> = tracks.iter().map(|t| t.0).collect();
        let mut events = Vec::new();
        for zone in &c.zones {
            let stays = state.inside.entry(zone.name.clone()).or_default();
            let within: BTreeMap<i64, i64> = tracks
                .iter()
                .filter(|(_, _, at)| inside(&zone.polygon, *at))
                .map(|(t, class, _)| (*t, *class))
                .collect();
            // Exits: seen outside now, or lost long enough (their dwell ends where last seen).
            let leaving: Vec<(i64, Moment)> = stays
                .iter()
                .filter_map(|(t, stay)| {
                    if within.contains_key(t) {
                        None
                    } else if seen.contains(t) {
                        Some((*t, now))
                    } else if now.frame.saturating_sub(stay.seen.frame) >= c.forget_after_frames {
                        Some((*t, stay.seen))
                    } else {
                        None
                    }
                })
                .collect();
            for (t, end) in leaving {
                if let Some(stay) = stays.remove(&t) {
                    let frames = end.frame.saturating_sub(stay.entered.frame);
                    events.push(ZoneEvent {
                        zone: zone.name.clone(),
                        track_id: t,
                        class_id: stay.class_id,
                        dwell: Some((frames, self.ms_between(stay.entered, end))),
                    });
                }
            }
            for (t, class_id) in within {
                match stays.get_mut(&t) {
                    Some(stay) => stay.seen = now,
                    None => {
                        stays.insert(
                            t,
                            Stay {
                                class_id,
                                entered: now,
                                seen: now,
                            },
                        );
                        events.push(ZoneEvent {
                            zone: zone.name.clone(),
                            track_id: t,
                            class_id,
                            dwell: None,
                        });
                    }
                }
            }
        }
        events
    }
}

/// Whether the input has the presentation-time column.
fn has_pts(input: &Schema, pts: &str) -> bool {
    input.field_with_name(pts).is_ok()
}

fn event_fields() -> Fields {
    Fields::from(vec![
        Field::new("zone", DataType::Utf8, false),
        Field::new("track_id", DataType::Int64, false),
        Field::new("class_id", DataType::Int64, false),
        Field::new("event", DataType::Utf8, false),
        Field::new("dwell_frames", DataType::Int64, true),
        Field::new("dwell_ms", DataType::Int64, true),
    ])
}

fn occupancy_fields() -> Fields {
    Fields::from(vec![
        Field::new("zone", DataType::Utf8, false),
        Field::new("count", DataType::Int64, false),
    ])
}

/// The two output columns, built row by row.
struct Columns {
    events: ListColumn,
    zone: Vec<String>,
    track: Vec<i64>,
    class: Vec<i64>,
    event: Vec<&'static str>,
    dwell_frames: Vec<Option<i64>>,
    dwell_ms: Vec<Option<i64>>,
    occupancy: ListColumn,
    occupied_zone: Vec<String>,
    count: Vec<i64>,
}

impl Columns {
    fn new(rows: usize) -> Self {
        Columns {
            events: ListColumn::new(event_fields(), rows),
            zone: Vec::new(),
            track: Vec::new(),
            class: Vec::new(),
            event: Vec::new(),
            dwell_frames: Vec::new(),
            dwell_ms: Vec::new(),
            occupancy: ListColumn::new(occupancy_fields(), rows),
            occupied_zone: Vec::new(),
            count: Vec::new(),
        }
    }

    fn push(&mut self, zones: &[ZoneAreaConfig], events: &[ZoneEvent], state: &ZoneState) {
        for e in events {
            self.zone.push(e.zone.clone());
            self.track.push(e.track_id);
            self.class.push(e.class_id);
            self.event
                .push(if e.dwell.is_some() { "exit" } else { "enter" });
            self.dwell_frames.push(e.dwell.map(|d| d.0));
            self.dwell_ms.push(e.dwell.map(|d| d.1));
        }
        self.events.row(events.len());
        for zone in zones {
            self.occupied_zone.push(zone.name.clone());
            let n = state.inside.get(&zone.name).map_or(0, BTreeMap::len);
            self.count.push(n as i64);
        }
        self.occupancy.row(zones.len());
    }

    fn finish(self) -> DataflowResult<Vec<ArrayRef>> {
        let events = self.events.finish(vec![
            Arc::new(StringArray::from(self.zone)),
            Arc::new(Int64Array::from(self.track)),
            Arc::new(Int64Array::from(self.class)),
            Arc::new(StringArray::from(self.event)),
            Arc::new(Int64Array::from(self.dwell_frames)),
            Arc::new(Int64Array::from(self.dwell_ms)),
        ])?;
        let occupancy = self.occupancy.finish(vec![
            Arc::new(StringArray::from(self.occupied_zone)),
            Arc::new(Int64Array::from(self.count)),
        ])?;
        Ok(vec![events, occupancy])
    }
}

impl KeyedLogic for Zone {
    type State = ZoneState;

    fn name(&self) -> &str {
        NAME
    }

    fn process(
        &mut self,
        _key: &str,
        state: &mut ZoneState,
        rows: &RecordBatch,
    ) -> DataflowResult<StageOutput> {
        let schema = self.output_schema(rows.schema_ref())?;
        let c = &self.config;
        let detections = DetectionsColumn::new(rows, &c.detections, true)?;
        let frames = int64_column(rows, &c.frame)?;
        let pts = if has_pts(rows.schema_ref(), &c.pts) {
            Some(int64_column(rows, &c.pts)?)
        } else {
            None
        };
        let mut columns = Columns::new(rows.num_rows());
        let (keep, rejected) = each_row(rows, NAME, |row| {
            let frame = frames.is_valid(row).then(|| frames.value(row));
            // Checked before anything changes, so a bad row leaves the state as it was.
            let frame = frame_order(frame, state.last_frame)?;
            let ms = match pts {
                Some(p) if p.is_null(row) => return Err(format!("null `{}`", c.pts)),
                Some(p) => Some(p.value(row)),
                None => None,
            };
            let objects = detections.row(row)?;
            let events = self.update(state, Moment { frame, ms }, &objects);
            columns.push(&c.zones, &events, state);
            Ok(())
        });
        let records = kept_with(rows, keep, schema, columns.finish()?)?;
        Ok(StageOutput { records, rejected })
    }
}

impl crate::StageKind for ZoneConfig {
    fn kind(&self) -> &'static str {
        NAME
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        Zone::new(self.clone())?.output_schema(input)
    }

    fn build(&self, _ctx: &crate::StageContext<'_>) -> DataflowResult<Step> {
        Ok(Step::Stateful(Box::new(Keyed {
            logic: Zone::new(self.clone())?,
            key: self.key.clone(),
        })))
    }

    fn describe(&self, _ctx: &crate::StageContext<'_>) -> String {
        format!(
            "rows sharded by `{}`; {} zone(s), anchor {}",
            self.key,
            self.zones.len(),
            self.anchor.name()
        )
    }

    fn stateful(&self) -> bool {
        true
    }
}
