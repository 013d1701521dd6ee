//! Rows → (key, value): the key template (`recs:{user_id}`) and the value (`json`, or a column).

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_schema::{DataType, Schema};
use serde::Deserialize;

/// What a key is set to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "String")]
pub enum ValueSpec {
    /// `json`: the whole row as a JSON object, as the `jsonl` sink writes it (top-level binary
    /// columns left out).
    #[default]
    Json,
    /// A column's text: strings as they are, binary as its bytes, numbers and dates as
    /// displayed, lists and structs as JSON.
    Column(String),
}

impl From<String> for ValueSpec {
    fn from(text: String) -> Self {
        if text == "json" {
            ValueSpec::Json
        } else {
            ValueSpec::Column(text)
        }
    }
}

impl ValueSpec {
    /// Whether `schema` has the column.
    pub(crate) fn check(&self, schema: &Schema) -> Result<(), String> {
        match self {
            ValueSpec::Json => Ok(()),
            ValueSpec::Column(name) => find(schema, name).map(|_| ()),
        }
    }
}

/// A key template: literal text and `{column}` placeholders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyTemplate {
    parts: Vec<Part>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Text(String),
    Column(String),
}

impl KeyTemplate {
    /// `recs:{user_id}`; `{{` and `}}` are literal braces.
    pub fn parse(template: &str) -> Result<KeyTemplate, String> {
        if template.is_empty() {
            return Err(
                "the template is empty: expected text with `{column}` placeholders, such as \
                 `recs:{user_id}`"
                    .into(),
            );
        }
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut chars = template.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    text.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    text.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some('{') | None => {
                                return Err(format!(
                                    "`{{{name}` has no closing `}}` (write `{{{{` for a literal \
                                     brace)"
                                ))
                            }
                            Some(c) => name.push(c),
                        }
                    }
                    if name.is_empty() {
                        return Err("`{}` names no column: expected `{column}`".into());
                    }
                    if !text.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut text)));
                    }
                    parts.push(Part::Column(name));
                }
                '}' => {
                    return Err("a `}` without its `{` (write `}}` for a literal brace)".to_string())
                }
                c => text.push(c),
            }
        }
        if !text.is_empty() {
            parts.push(Part::Text(text));
        }
        Ok(KeyTemplate { parts })
    }

    /// The columns the template names, in order.
    pub fn columns(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Column(name) => Some(name.as_str()),
            Part::Text(_) => None,
        })
    }

    /// Whether `schema` has every column the template names, each one a key can be made of.
    pub(crate) fn check(&self, schema: &Schema) -> Result<(), String> {
        for name in self.columns() {
            let data_type = find(schema, name)?;
            if !scalar(data_type) {
                return Err(format!(
                    "column `{name}` is {data_type}: a key is made of text, numbers, booleans \
                     or dates"
                ));
            }
        }
        Ok(())
    }
}

/// The type of `schema`'s column `name`, or an error naming it and the columns there are.
fn find<'a>(schema: &'a Schema, name: &str) -> Result<&'a DataType, String> {
    schema
        .field_with_name(name)
        .map(|f| f.data_type())
        .map_err(|_| missing(schema, name))
}

fn missing(schema: &Schema, name: &str) -> String {
    let columns: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    format!(
        "names column `{name}`, which the results do not have (they have: {})",
        columns.join(", ")
    )
}

fn nested(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::List(_)
            | DataType::LargeList(_)
            | DataType::FixedSizeList(..)
            | DataType::ListView(_)
            | DataType::LargeListView(_)
            | DataType::Struct(_)
            | DataType::Map(..)
            | DataType::Union(..)
    )
}

fn binary(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
            | DataType::FixedSizeBinary(_)
    )
}

fn scalar(data_type: &DataType) -> bool {
    !nested(data_type) && !binary(data_type)
}

/// What one row does to its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    Set(Vec<u8>),
    /// A null value: the key's latest value is none.
    Delete,
}

/// Each row's key and write, in row order; `None` for a row whose key cannot be made (a key
/// column is null).
pub(crate) fn render(
    batch: &RecordBatch,
    template: &KeyTemplate,
    value: &ValueSpec,
) -> Result<Vec<Option<(String, Write)>>, String> {
    let rows = batch.num_rows();
    let keys = keys(batch, template)?;
    let values = values(batch, value)?;
    if keys.len() != rows || values.len() != rows {
        return Err(format!(
            "{} key(s) and {} value(s) for {rows} rows",
            keys.len(),
            values.len()
        ));
    }
    Ok(keys
        .into_iter()
        .zip(values)
        .map(|(k, v)| k.map(|k| (k, v)))
        .collect())
}

fn column<'b>(batch: &'b RecordBatch, name: &str, role: &str) -> Result<&'b dyn Array, String> {
    batch
        .column_by_name(name)
        .map(|c| c.as_ref())
        .ok_or_else(|| format!("{role}: {}", missing(&batch.schema(), name)))
}

fn keys(batch: &RecordBatch, template: &KeyTemplate) -> Result<Vec<Option<String>>, String> {
    let options = FormatOptions::default();
    let mut formatters = Vec::new();
    for part in &template.parts {
        formatters.push(match part {
            Part::Text(_) => None,
            Part::Column(name) => {
                let array = column(batch, name, "key")?;
                let formatter =
                    ArrayFormatter::try_new(array, &options).map_err(|e| e.to_string())?;
                Some((array, formatter))
            }
        });
    }
    let mut out = Vec::with_capacity(batch.num_rows());
    for row in 0..batch.num_rows() {
        let mut key = String::new();
        let mut null = false;
        for (part, formatter) in template.parts.iter().zip(&formatters) {
            match (part, formatter) {
                (_, Some((array, _))) if array.is_null(row) => null = true,
                (_, Some((_, f))) => key.push_str(&f.value(row).to_string()),
                (Part::Text(text), None) => key.push_str(text),
                (Part::Column(_), None) => null = true,
            }
        }
        out.push((!null).then_some(key));
    }
    Ok(out)
}

fn values(batch: &RecordBatch, value: &ValueSpec) -> Result<Vec<Write>, String> {
    let rows = batch.num_rows();
    let name = match value {
        ValueSpec::Json => {
            let text = crate::jsonl::json_lines(batch).map_err(|e| e.to_string())?;
            return Ok(text
                .split(|&b| b == b'\n')
                .take(rows)
                .map(|line| Write::Set(line.to_vec()))
                .collect());
        }
        ValueSpec::Column(name) => name,
    };
    let array = column(batch, name, "value")?;
    let set = |row: usize, bytes: &[u8]| {
        if array.is_null(row) {
            Write::Delete
        } else {
            Write::Set(bytes.to_vec())
        }
    };
    let data_type = array.data_type();
    Ok(match data_type {
        DataType::Binary => {
            let a = array.as_binary::<i32>();
            (0..rows).map(|r| set(r, a.value(r))).collect()
        }
        DataType::LargeBinary => {
            let a = array.as_binary::<i64>();
            (0..rows).map(|r| set(r, a.value(r))).collect()
        }
        DataType::BinaryView => {
            let a = array.as_binary_view();
            (0..rows).map(|r| set(r, a.value(r))).collect()
        }
        DataType::FixedSizeBinary(_) => {
            let a = array.as_fixed_size_binary();
            (0..rows).map(|r| set(r, a.value(r))).collect()
        }
        t if nested(t) => nested_json(batch, name, array)?
            .into_iter()
            .enumerate()
            .map(|(r, json)| set(r, json.as_bytes()))
            .collect(),
        _ => {
            let options = FormatOptions::default();
            let f = ArrayFormatter::try_new(array, &options).map_err(|e| e.to_string())?;
            (0..rows)
                .map(|r| set(r, f.value(r).to_string().as_bytes()))
                .collect()
        }
    })
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
    let text = crate::jsonl::json_lines(&one).map_err(|e| e.to_string())?;
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
    use super::*;
    use arrow_array::builder::{ListBuilder, StringBuilder};
    use arrow_array::{BinaryArray, Float32Array, Int64Array, StringArray};
    use arrow_schema::Field;

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

    fn set(text: &str) -> Write {
        Write::Set(text.as_bytes().to_vec())
    }

    #[test]
    fn templates_parse_placeholders_and_escaped_braces() {
        let t = KeyTemplate::parse("recs:{user_id}:{name}").unwrap();
        assert_eq!(t.columns().collect::<Vec<_>>(), ["user_id", "name"]);
        let t = KeyTemplate::parse("{{lit}}:{a}").unwrap();
        assert_eq!(
            t.parts,
            [Part::Text("{lit}:".into()), Part::Column("a".into())]
        );
        assert_eq!(KeyTemplate::parse("fixed").unwrap().columns().count(), 0);
        for (bad, says) in [
            ("", "empty"),
            ("recs:{user", "no closing"),
            ("recs:{a{b}", "no closing"),
            ("recs:{}", "names no column"),
            ("recs:}", "without its `{`"),
        ] {
            let e = KeyTemplate::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn keys_fill_each_placeholder_and_a_null_key_column_skips_the_row() {
        let t = KeyTemplate::parse("u:{user_id}/{score}").unwrap();
        let rows = render(&batch(), &t, &ValueSpec::Column("name".into())).unwrap();
        assert_eq!(rows[0], Some(("u:1/0.5".into(), set("x y"))));
        // A null value deletes the key.
        assert_eq!(rows[1], Some(("u:2/1.25".into(), Write::Delete)));
        assert_eq!(rows[2], None);
    }

    #[test]
    fn values_are_the_row_as_json_or_a_columns_text() {
        let t = KeyTemplate::parse("k{score}").unwrap();
        let json = render(&batch(), &t, &ValueSpec::Json).unwrap();
        let Some((key, Write::Set(bytes))) = &json[0] else {
            panic!("{json:?}")
        };
        assert_eq!(key, "k0.5");
        let row: serde_json::Value = serde_json::from_slice(bytes).unwrap();
        assert_eq!(
            row,
            serde_json::json!({"user_id": 1, "name": "x y", "recs": ["a", "b"], "score": 0.5})
        );
        let lists = render(&batch(), &t, &ValueSpec::Column("recs".into())).unwrap();
        let values: Vec<Option<Write>> = lists.into_iter().map(|r| r.map(|(_, w)| w)).collect();
        assert_eq!(
            values,
            [
                Some(set(r#"["a","b"]"#)),
                Some(Write::Delete),
                Some(set(r#"["c"]"#))
            ]
        );
        let blob = render(&batch(), &t, &ValueSpec::Column("blob".into())).unwrap();
        assert_eq!(blob[0].as_ref().unwrap().1, Write::Set(vec![0, 255]));
        let numbers = render(&batch(), &t, &ValueSpec::Column("user_id".into())).unwrap();
        assert_eq!(numbers[1].as_ref().unwrap().1, set("2"));
    }

    #[test]
    fn a_template_or_value_naming_a_missing_column_says_which() {
        let schema = batch().schema();
        let e = KeyTemplate::parse("recs:{user}")
            .unwrap()
            .check(&schema)
            .unwrap_err();
        assert!(e.contains("`user`") && e.contains("user_id, name"), "{e}");
        let e = KeyTemplate::parse("recs:{recs}")
            .unwrap()
            .check(&schema)
            .unwrap_err();
        assert!(e.contains("`recs` is List"), "{e}");
        let e = ValueSpec::Column("nope".into()).check(&schema).unwrap_err();
        assert!(e.contains("`nope`"), "{e}");
        assert!(ValueSpec::Json.check(&schema).is_ok());
        // At write time too, should a batch lack the column.
        let t = KeyTemplate::parse("{missing}").unwrap();
        let e = render(&batch(), &t, &ValueSpec::Json).unwrap_err();
        assert!(e.starts_with("key: names column `missing`"), "{e}");
        let schema = Schema::new(vec![Field::new("a", DataType::Int64, true)]);
        assert!(KeyTemplate::parse("{a}").unwrap().check(&schema).is_ok());
    }
}
