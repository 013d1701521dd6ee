//! Rows → keys and values: each row's key from the template (`recs:{user_id}`) and its value
//! (the row as JSON, or a column's text), written into buffers reused from batch to batch.

use std::fmt::Write as _;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, UInt32Type, UInt64Type};
use arrow_array::{
    Array, BinaryArray, BinaryViewArray, FixedSizeBinaryArray, Int32Array, Int64Array,
    LargeBinaryArray, LargeStringArray, RecordBatch, StringArray, StringViewArray, UInt32Array,
    UInt64Array,
};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_schema::{DataType, Schema};

use super::template::{missing, nested, KeyTemplate, Part, ValueSpec};

/// A span of a buffer: `start..end`.
type Span = (usize, usize);

/// One batch's rows: keys in one buffer, values in another (for `json`, the batch's JSON lines
/// as arrow-json wrote them).
#[derive(Default)]
pub(crate) struct Rendered {
    keys: Vec<u8>,
    /// Per row: its key in `keys`; `None` when a key column is null (the row has no key).
    key_spans: Vec<Option<Span>>,
    values: Vec<u8>,
    /// Per row: its value in `values`; `None` for a null value (the key is deleted).
    value_spans: Vec<Option<Span>>,
}

impl Rendered {
    fn clear(&mut self) {
        self.keys.clear();
        self.key_spans.clear();
        self.values.clear();
        self.value_spans.clear();
    }

    /// The rows: each one's key (none for a row without one) and value (none: delete).
    #[allow(
        clippy::indexing_slicing,
        reason = "each key span was taken from `keys`' own length as the key was written"
    )]
    pub fn rows(&self) -> impl Iterator<Item = (Option<&[u8]>, Option<Span>)> + '_ {
        self.key_spans
            .iter()
            .zip(&self.value_spans)
            .map(|(k, v)| (k.map(|(s, e)| &self.keys[s..e]), *v))
    }

    /// The values' buffer, which the spans of [`Self::rows`] point into.
    pub fn take_values(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.values)
    }

    /// Rows whose key could not be made.
    pub fn keyless(&self) -> usize {
        self.key_spans.iter().filter(|k| k.is_none()).count()
    }

    pub fn len(&self) -> usize {
        self.key_spans.len()
    }

    #[cfg(test)]
    pub fn push_row(&mut self, key: Option<&[u8]>, value: Option<&[u8]>) {
        self.key_spans
            .push(key.map(|k| push_span(&mut self.keys, k)));
        self.value_spans
            .push(value.map(|v| push_span(&mut self.values, v)));
    }
}

#[cfg(test)]
fn push_span(buffer: &mut Vec<u8>, bytes: &[u8]) -> Span {
    let start = buffer.len();
    buffer.extend_from_slice(bytes);
    (start, buffer.len())
}

/// Renders `batch` into `out` (emptied first): each row's key and write, in row order.
pub(crate) fn render(
    batch: &RecordBatch,
    template: &KeyTemplate,
    value: &ValueSpec,
    out: &mut Rendered,
) -> Result<(), String> {
    out.clear();
    let rows = batch.num_rows();
    keys(batch, template, out)?;
    values(batch, value, out)?;
    if out.key_spans.len() != rows || out.value_spans.len() != rows {
        return Err(format!(
            "{} key(s) and {} value(s) for {rows} rows",
            out.key_spans.len(),
            out.value_spans.len()
        ));
    }
    Ok(())
}

fn column<'b>(batch: &'b RecordBatch, name: &str, role: &str) -> Result<&'b dyn Array, String> {
    batch
        .column_by_name(name)
        .map(|c| c.as_ref())
        .ok_or_else(|| format!("{role}: {}", missing(&batch.schema(), name)))
}

/// A column's values as text. Integers and strings are written straight from the array (the
/// text `ArrayFormatter` gives them); other types through it.
enum Text<'a> {
    Int64(&'a Int64Array),
    Int32(&'a Int32Array),
    UInt64(&'a UInt64Array),
    UInt32(&'a UInt32Array),
    Utf8(&'a StringArray),
    LargeUtf8(&'a LargeStringArray),
    Utf8View(&'a StringViewArray),
    /// Binary values as their bytes (values only: a key never names a binary column).
    Binary(&'a BinaryArray),
    LargeBinary(&'a LargeBinaryArray),
    BinaryView(&'a BinaryViewArray),
    FixedSizeBinary(&'a FixedSizeBinaryArray),
    Formatted(ArrayFormatter<'a>),
}

impl<'a> Text<'a> {
    fn new(array: &'a dyn Array, raw_binary: bool) -> Result<Text<'a>, String> {
        Ok(match array.data_type() {
            DataType::Int64 => Text::Int64(array.as_primitive::<Int64Type>()),
            DataType::Int32 => Text::Int32(array.as_primitive::<Int32Type>()),
            DataType::UInt64 => Text::UInt64(array.as_primitive::<UInt64Type>()),
            DataType::UInt32 => Text::UInt32(array.as_primitive::<UInt32Type>()),
            DataType::Utf8 => Text::Utf8(array.as_string::<i32>()),
            DataType::LargeUtf8 => Text::LargeUtf8(array.as_string::<i64>()),
            DataType::Utf8View => Text::Utf8View(array.as_string_view()),
            DataType::Binary if raw_binary => Text::Binary(array.as_binary::<i32>()),
            DataType::LargeBinary if raw_binary => Text::LargeBinary(array.as_binary::<i64>()),
            DataType::BinaryView if raw_binary => Text::BinaryView(array.as_binary_view()),
            DataType::FixedSizeBinary(_) if raw_binary => {
                Text::FixedSizeBinary(array.as_fixed_size_binary())
            }
            _ => Text::Formatted(
                ArrayFormatter::try_new(array, &FormatOptions::default())
                    .map_err(|e| e.to_string())?,
            ),
        })
    }

    /// Appends row `row`'s text (the row is not null).
    fn write(&self, row: usize, out: &mut Vec<u8>) -> Result<(), String> {
        match self {
            Text::Int64(a) => push_i64(out, a.value(row)),
            Text::Int32(a) => push_i64(out, a.value(row).into()),
            Text::UInt64(a) => push_u64(out, a.value(row)),
            Text::UInt32(a) => push_u64(out, a.value(row).into()),
            Text::Utf8(a) => out.extend_from_slice(a.value(row).as_bytes()),
            Text::LargeUtf8(a) => out.extend_from_slice(a.value(row).as_bytes()),
            Text::Utf8View(a) => out.extend_from_slice(a.value(row).as_bytes()),
            Text::Binary(a) => out.extend_from_slice(a.value(row)),
            Text::LargeBinary(a) => out.extend_from_slice(a.value(row)),
            Text::BinaryView(a) => out.extend_from_slice(a.value(row)),
            Text::FixedSizeBinary(a) => out.extend_from_slice(a.value(row)),
            // `Display`, as `to_string` wrote it: a value it cannot format reads `ERROR: …`.
            Text::Formatted(f) => write!(Utf8Sink(out), "{}", f.value(row))
                .map_err(|_| format!("row {row} cannot be written as text"))?,
        }
        Ok(())
    }
}

/// `fmt::Write` into a byte buffer.
struct Utf8Sink<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Utf8Sink<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// `value` in decimal, as `ArrayFormatter` writes integers.
#[allow(
    clippy::indexing_slicing,
    reason = "`at` counts down from 20, and no u64 has more than 20 digits"
)]
pub(super) fn push_u64(out: &mut Vec<u8>, mut value: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

fn push_i64(out: &mut Vec<u8>, value: i64) {
    if value < 0 {
        out.push(b'-');
    }
    push_u64(out, value.unsigned_abs());
}

/// The decimal text of `value`, into `out` (for the protocol's lengths too).
pub(super) fn push_len(out: &mut Vec<u8>, value: usize) {
    push_u64(out, value as u64);
}

fn keys(batch: &RecordBatch, template: &KeyTemplate, out: &mut Rendered) -> Result<(), String> {
    enum Piece<'a> {
        Text(&'a [u8]),
        Column(&'a str, &'a dyn Array, Text<'a>),
    }
    let mut pieces = Vec::with_capacity(template.parts().len());
    for part in template.parts() {
        pieces.push(match part {
            Part::Text(text) => Piece::Text(text.as_bytes()),
            Part::Column(name) => {
                let array = column(batch, name, "key")?;
                Piece::Column(name, array, Text::new(array, false)?)
            }
        });
    }
    out.key_spans.reserve(batch.num_rows());
    'rows: for row in 0..batch.num_rows() {
        let start = out.keys.len();
        for piece in &pieces {
            match piece {
                Piece::Text(text) => out.keys.extend_from_slice(text),
                Piece::Column(_, array, _) if array.is_null(row) => {
                    out.keys.truncate(start);
                    out.key_spans.push(None);
                    continue 'rows;
                }
                Piece::Column(name, _, text) => text
                    .write(row, &mut out.keys)
                    .map_err(|e| format!("key column `{name}`: {e}"))?,
            }
        }
        out.key_spans.push(Some((start, out.keys.len())));
    }
    Ok(())
}

fn values(batch: &RecordBatch, value: &ValueSpec, out: &mut Rendered) -> Result<(), String> {
    let rows = batch.num_rows();
    let name = match value {
        ValueSpec::Json => {
            // The batch's JSON lines are kept whole: each row's value is its line.
            out.values = crate::lines::json_lines(batch).map_err(|e| e.to_string())?;
            out.value_spans.reserve(rows);
            let mut start = 0;
            for line in out.values.split(|&b| b == b'\n').take(rows) {
                out.value_spans.push(Some((start, start + line.len())));
                start += line.len() + 1;
            }
            return Ok(());
        }
        ValueSpec::Column(name) => name,
    };
    let array = column(batch, name, "value")?;
    out.value_spans.reserve(rows);
    if nested(array.data_type()) {
        for (row, json) in nested_json(batch, name, array)?.into_iter().enumerate() {
            out.value_spans.push((!array.is_null(row)).then(|| {
                let start = out.values.len();
                out.values.extend_from_slice(json.as_bytes());
                (start, out.values.len())
            }));
        }
        return Ok(());
    }
    let text = Text::new(array, true)?;
    for row in 0..rows {
        if array.is_null(row) {
            out.value_spans.push(None);
            continue;
        }
        let start = out.values.len();
        text.write(row, &mut out.values)
            .map_err(|e| format!("value column `{name}`: {e}"))?;
        out.value_spans.push(Some((start, out.values.len())));
    }
    Ok(())
}

/// Each row's value of a list or struct column as JSON, as the `jsonl` sink writes it.
fn nested_json(batch: &RecordBatch, name: &str, array: &dyn Array) -> Result<Vec<String>, String> {
    let schema = batch.schema();
    let field = schema.field_with_name(name).map_err(|e| e.to_string())?;
    let one = RecordBatch::try_new(
        Arc::new(Schema::new(vec![field.clone()])),
        vec![arrow_array::make_array(array.to_data())],
    )
    .map_err(|e| e.to_string())?;
    let text = crate::lines::json_lines(&one).map_err(|e| e.to_string())?;
    text.split(|&b| b == b'\n')
        .take(batch.num_rows())
        .map(|line| {
            let mut object: serde_json::Map<String, serde_json::Value> =
                serde_json::from_slice(line).map_err(|e| format!("column `{name}`: {e}"))?;
            Ok(object
                .remove(name)
                .unwrap_or(serde_json::Value::Null)
                .to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::writes::Write;
    use super::*;

    impl Rendered {
        /// Row `row`'s key and write.
        fn row(&self, row: usize) -> Option<(String, Write<'_>)> {
            let (s, e) = self.key_spans[row]?;
            let key = String::from_utf8_lossy(&self.keys[s..e]).into_owned();
            let write = match self.value_spans[row] {
                Some((s, e)) => Write::Set(&self.values[s..e]),
                None => Write::Delete,
            };
            Some((key, write))
        }
    }
    use arrow_array::builder::{ListBuilder, StringBuilder};
    use arrow_array::{Float32Array, Int16Array};

    fn batch() -> RecordBatch {
        let mut recs = ListBuilder::new(StringBuilder::new());
        recs.values().append_value("a");
        recs.values().append_value("b");
        recs.append(true);
        recs.append(false);
        recs.values().append_value("c");
        recs.append(true);
        RecordBatch::try_from_iter(vec![
            (
                "user_id",
                Arc::new(Int64Array::from(vec![Some(1), Some(2), None])) as _,
            ),
            (
                "name",
                Arc::new(StringArray::from(vec![Some("x y"), None, Some("z")])) as _,
            ),
            ("recs", Arc::new(recs.finish()) as _),
            (
                "score",
                Arc::new(Float32Array::from(vec![0.5, 1.25, -2.0])) as _,
            ),
            (
                "blob",
                Arc::new(BinaryArray::from(vec![&b"\x00\xff"[..], b"", b"b"])) as _,
            ),
        ])
        .unwrap()
    }

    fn rendered(batch: &RecordBatch, template: &str, value: ValueSpec) -> Rendered {
        let mut out = Rendered::default();
        render(
            batch,
            &KeyTemplate::parse(template).unwrap(),
            &value,
            &mut out,
        )
        .unwrap();
        out
    }

    fn set(text: &str) -> Write<'_> {
        Write::Set(text.as_bytes())
    }

    #[test]
    fn keys_fill_each_placeholder_and_a_null_key_column_skips_the_row() {
        let out = rendered(
            &batch(),
            "u:{user_id}/{score}",
            ValueSpec::Column("name".into()),
        );
        assert_eq!(out.row(0), Some(("u:1/0.5".into(), set("x y"))));
        // A null value deletes the key.
        assert_eq!(out.row(1), Some(("u:2/1.25".into(), Write::Delete)));
        assert_eq!(out.row(2), None);
        assert_eq!((out.len(), out.keyless()), (3, 1));
        // The buffers are reused: a second batch replaces the first's rows.
        let mut again = out;
        let t = KeyTemplate::parse("{name}").unwrap();
        render(&batch(), &t, &ValueSpec::Json, &mut again).unwrap();
        assert_eq!(again.row(0).unwrap().0, "x y");
        assert_eq!((again.len(), again.keyless()), (3, 1));
    }

    #[test]
    fn keys_are_the_text_arrow_formats_for_every_integer_width_and_strings() {
        let keys = RecordBatch::try_from_iter(vec![
            (
                "i64",
                Arc::new(Int64Array::from(vec![i64::MIN, -1, 0, i64::MAX])) as _,
            ),
            (
                "i32",
                Arc::new(Int32Array::from(vec![i32::MIN, -7, 0, 42])) as _,
            ),
            (
                "u64",
                Arc::new(UInt64Array::from(vec![0, 9, 10, u64::MAX])) as _,
            ),
            (
                "u32",
                Arc::new(UInt32Array::from(vec![0, 1, 99, u32::MAX])) as _,
            ),
            ("i16", Arc::new(Int16Array::from(vec![-3, 0, 5, 300])) as _),
            (
                "s",
                Arc::new(StringArray::from(vec!["", "é", "a b", "{x}"])) as _,
            ),
            (
                "ls",
                Arc::new(LargeStringArray::from(vec!["l", "", "m", "n"])) as _,
            ),
            (
                "sv",
                Arc::new(StringViewArray::from(vec![
                    "a string longer than twelve bytes",
                    "v",
                    "",
                    "w",
                ])) as _,
            ),
        ])
        .unwrap();
        let names: Vec<String> = keys
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        let template: String = names.iter().map(|n| format!("{{{n}}}|")).collect();
        let out = rendered(&keys, &template, ValueSpec::Json);
        let formatters: Vec<ArrayFormatter> = keys
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &FormatOptions::default()).unwrap())
            .collect();
        for row in 0..keys.num_rows() {
            let expected: String = formatters
                .iter()
                .map(|f| format!("{}|", f.value(row)))
                .collect();
            assert_eq!(out.row(row).unwrap().0, expected);
        }
        assert_eq!(
            out.row(0).unwrap().0,
            format!(
                "{}|-2147483648|0|0|-3||l|a string longer than twelve bytes|",
                i64::MIN
            )
        );
    }

    #[test]
    fn values_are_the_row_as_json_or_a_columns_text() {
        let json = rendered(&batch(), "k{score}", ValueSpec::Json);
        let Some((key, Write::Set(bytes))) = json.row(0) else {
            panic!("no first row")
        };
        assert_eq!(key, "k0.5");
        let row: serde_json::Value = serde_json::from_slice(bytes).unwrap();
        assert_eq!(
            row,
            serde_json::json!({"user_id": 1, "name": "x y", "recs": ["a", "b"], "score": 0.5})
        );
        let third: serde_json::Value = serde_json::from_slice(match json.row(2).unwrap().1 {
            Write::Set(b) => b,
            Write::Delete => panic!("a row as JSON is never null"),
        })
        .unwrap();
        assert_eq!(third["name"], "z");
        let lists = rendered(&batch(), "k{score}", ValueSpec::Column("recs".into()));
        let values: Vec<Write> = (0..3).map(|r| lists.row(r).unwrap().1).collect();
        assert_eq!(
            values,
            [set(r#"["a","b"]"#), Write::Delete, set(r#"["c"]"#)]
        );
        let blob = rendered(&batch(), "k{score}", ValueSpec::Column("blob".into()));
        assert_eq!(blob.row(0).unwrap().1, Write::Set(&[0, 255]));
        assert_eq!(blob.row(1).unwrap().1, Write::Set(b""));
        let numbers = rendered(&batch(), "k{score}", ValueSpec::Column("user_id".into()));
        assert_eq!(numbers.row(1).unwrap().1, set("2"));
        assert_eq!(numbers.row(2).unwrap().1, Write::Delete);
        let floats = rendered(&batch(), "k{score}", ValueSpec::Column("score".into()));
        assert_eq!(floats.row(2).unwrap().1, set("-2.0"));
    }

    #[test]
    fn a_batch_lacking_a_named_column_says_which() {
        let mut out = Rendered::default();
        let t = KeyTemplate::parse("{missing}").unwrap();
        let e = render(&batch(), &t, &ValueSpec::Json, &mut out).unwrap_err();
        assert!(e.starts_with("key: names column `missing`"), "{e}");
        let t = KeyTemplate::parse("{user_id}").unwrap();
        let e = render(&batch(), &t, &ValueSpec::Column("gone".into()), &mut out).unwrap_err();
        assert!(e.starts_with("value: names column `gone`"), "{e}");
    }
}
