//! Whether a writer's message reads as the reader's: field types compared by their wire
//! encoding, and the message a payload's Confluent message indexes name.

use std::collections::HashSet;

use prost_reflect::{FieldDescriptor, FileDescriptor, Kind, MessageDescriptor};

use super::{declared_fields, kind_name};

/// Families of field types whose encodings read as each other.
#[derive(PartialEq, Eq)]
enum WireFamily {
    /// int32, int64, uint32, uint64, bool and enums: plain varints, which protobuf reads across
    /// these types (truncating to 32 bits where the reader's type is narrower).
    Varint,
    /// sint32, sint64: zigzag varints.
    Zigzag,
    /// fixed32, sfixed32.
    Fixed32,
    /// fixed64, sfixed64.
    Fixed64,
    Float,
    Double,
    String,
    Bytes,
    Message,
}

fn wire_family(kind: &Kind) -> WireFamily {
    match kind {
        Kind::Int32 | Kind::Int64 | Kind::Uint32 | Kind::Uint64 | Kind::Bool | Kind::Enum(_) => {
            WireFamily::Varint
        }
        Kind::Sint32 | Kind::Sint64 => WireFamily::Zigzag,
        Kind::Fixed32 | Kind::Sfixed32 => WireFamily::Fixed32,
        Kind::Fixed64 | Kind::Sfixed64 => WireFamily::Fixed64,
        Kind::Float => WireFamily::Float,
        Kind::Double => WireFamily::Double,
        Kind::String => WireFamily::String,
        Kind::Bytes => WireFamily::Bytes,
        Kind::Message(_) => WireFamily::Message,
    }
}

/// The first field that `writer` and `reader` both have (by number) with types that do not
/// read as each other, described; `None` when the reader reads every writer's field it knows.
///
/// Strict: the same type, except within a `WireFamily`; `string`, `bytes` and messages are
/// never mixed (protobuf would read some of those, but only for some values); repeated and
/// singular are never mixed; messages are compared field by field.
pub(crate) fn first_conflict(
    writer: &MessageDescriptor,
    reader: &MessageDescriptor,
) -> Option<String> {
    conflict_in(writer, reader, "", &mut HashSet::new())
}

fn conflict_in(
    writer: &MessageDescriptor,
    reader: &MessageDescriptor,
    prefix: &str,
    seen: &mut HashSet<(String, String)>,
) -> Option<String> {
    if !seen.insert((writer.full_name().to_owned(), reader.full_name().to_owned())) {
        return None;
    }
    for r in declared_fields(reader) {
        let Some(w) = writer.get_field(r.number()) else {
            continue;
        };
        let path = format!("{prefix}{}", r.name());
        let describe = |what: String| format!("field {} `{path}`: {what}", r.number());
        let shape_of = |f: &FieldDescriptor| {
            if f.is_map() {
                "a map"
            } else if f.is_list() {
                "repeated"
            } else {
                "singular"
            }
        };
        if w.is_map() != r.is_map() || w.is_list() != r.is_list() {
            return Some(describe(format!(
                "{} in the writer, {} in the reader",
                shape_of(&w),
                shape_of(&r)
            )));
        }
        if w.is_group() != r.is_group() {
            return Some(describe(
                "a group in one schema and a message in the other".into(),
            ));
        }
        match (w.kind(), r.kind()) {
            (Kind::Message(wm), Kind::Message(rm)) => {
                if let Some(conflict) = conflict_in(&wm, &rm, &format!("{path}."), seen) {
                    return Some(conflict);
                }
            }
            (wk, rk) if wire_family(&wk) != wire_family(&rk) => {
                return Some(describe(format!(
                    "{} in the writer, {} in the reader",
                    kind_name(&wk),
                    kind_name(&rk)
                )));
            }
            _ => {}
        }
    }
    None
}

/// The message at `indexes` (Confluent message indexes) of `file`.
pub(crate) fn message_at(file: &FileDescriptor, indexes: &[i32]) -> Option<MessageDescriptor> {
    let (first, rest) = indexes.split_first()?;
    let mut message = file.messages().nth(usize::try_from(*first).ok()?)?;
    for index in rest {
        let child = message
            .child_messages()
            .nth(usize::try_from(*index).ok()?)?;
        message = child;
    }
    Some(message)
}
