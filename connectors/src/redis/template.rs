//! What the configuration says about keys and values: the key template (`recs:{user_id}`) and
//! the value (`json`, or a column), and which columns they may name.

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
pub(super) enum Part {
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

    /// The template's parts: literal text, or a column's name.
    pub(super) fn parts(&self) -> &[Part] {
        &self.parts
    }
}

/// The type of `schema`'s column `name`, or an error naming it and the columns there are.
pub(super) fn find<'a>(schema: &'a Schema, name: &str) -> Result<&'a DataType, String> {
    schema
        .field_with_name(name)
        .map(|f| f.data_type())
        .map_err(|_| missing(schema, name))
}

pub(super) fn missing(schema: &Schema, name: &str) -> String {
    let columns: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    format!(
        "names column `{name}`, which the results do not have (they have: {})",
        columns.join(", ")
    )
}

pub(super) fn nested(data_type: &DataType) -> bool {
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

fn scalar(data_type: &DataType) -> bool {
    !nested(data_type) && !crate::lines::is_binary(data_type)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use arrow_schema::Field;

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
    fn a_template_or_value_naming_a_missing_column_says_which() {
        let schema = Schema::new(vec![
            Field::new("user_id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
            Field::new(
                "recs",
                DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, true))),
                true,
            ),
        ]);
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
        let schema = Schema::new(vec![Field::new("a", DataType::Int64, true)]);
        assert!(KeyTemplate::parse("{a}").unwrap().check(&schema).is_ok());
    }
}
