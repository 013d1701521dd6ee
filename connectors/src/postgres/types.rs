//! Arrow types → PostgreSQL types: what a column the sink creates is, what its values are sent
//! as, and which types of an existing table's column can take them.

use arrow_schema::DataType;

/// How a column's values are sent (and the family of SQL types that can take them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SqlType {
    Bool,
    Int2,
    Int4,
    Int8,
    Float4,
    Float8,
    Text,
    Bytea,
    Timestamptz,
    /// Sent as text (`2024-01-31`), cast in SQL.
    Date,
    /// Sent as text (`12:30:00.5`), cast in SQL.
    Time,
    /// Unsigned 64-bit integers and decimals, sent as text and cast in SQL (no loss).
    Numeric,
    /// Lists, structs and maps, as JSON.
    Jsonb,
}

/// The binary COPY form a column's values are written in: a PostgreSQL type's binary format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    Bool,
    Int2,
    Int4,
    Int8,
    Float4,
    Float8,
    /// Also the form of values PostgreSQL parses (times, decimals for non-numeric columns).
    Text,
    Bytea,
    /// Microseconds since 2000-01-01: `timestamptz`, and `timestamp` in UTC.
    Timestamp,
    Date,
    Numeric,
    Jsonb,
}

impl Wire {
    /// The SQL type of a staging column holding these values.
    pub fn type_name(self) -> &'static str {
        match self {
            Wire::Bool => "bool",
            Wire::Int2 => "int2",
            Wire::Int4 => "int4",
            Wire::Int8 => "int8",
            Wire::Float4 => "float4",
            Wire::Float8 => "float8",
            Wire::Text => "text",
            Wire::Bytea => "bytea",
            Wire::Timestamp => "timestamptz",
            Wire::Date => "date",
            Wire::Numeric => "numeric",
            Wire::Jsonb => "jsonb",
        }
    }
}

/// How values of one [`SqlType`] reach a column of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    /// PostgreSQL's assignment cast (none when the types are equal).
    Assign,
    /// An explicit cast to the column's base type (text to `jsonb`).
    Cast(&'static str),
}

impl SqlType {
    /// The SQL type of an Arrow type; the error says which types have one.
    pub fn of(data_type: &DataType) -> Result<SqlType, String> {
        use DataType as D;
        Ok(match data_type {
            D::Boolean => SqlType::Bool,
            D::Int8 | D::Int16 | D::UInt8 => SqlType::Int2,
            D::Int32 | D::UInt16 => SqlType::Int4,
            D::Int64 | D::UInt32 => SqlType::Int8,
            D::UInt64 => SqlType::Numeric,
            D::Float16 | D::Float32 => SqlType::Float4,
            D::Float64 => SqlType::Float8,
            // An all-null column: its values fit any type, text is the least surprising.
            D::Null | D::Utf8 | D::LargeUtf8 | D::Utf8View => SqlType::Text,
            D::Binary | D::LargeBinary | D::BinaryView | D::FixedSizeBinary(_) => SqlType::Bytea,
            D::Timestamp(_, _) => SqlType::Timestamptz,
            D::Date32 | D::Date64 => SqlType::Date,
            D::Time32(_) | D::Time64(_) => SqlType::Time,
            D::Decimal32(..) | D::Decimal64(..) | D::Decimal128(..) | D::Decimal256(..) => {
                SqlType::Numeric
            }
            D::List(_)
            | D::LargeList(_)
            | D::FixedSizeList(..)
            | D::ListView(_)
            | D::LargeListView(_)
            | D::Struct(_)
            | D::Map(..) => SqlType::Jsonb,
            D::Dictionary(_, values) => SqlType::of(values)?,
            other => {
                return Err(format!(
                    "Arrow type {other} has no PostgreSQL type (expected booleans, integers, \
                     floats, decimals, strings, binary, timestamps, dates, times, or lists, \
                     structs and maps, which become jsonb)"
                ))
            }
        })
    }

    /// The type of a column the sink creates.
    pub fn create_type(data_type: &DataType) -> Result<String, String> {
        use DataType as D;
        Ok(match (SqlType::of(data_type)?, data_type) {
            (_, D::Dictionary(_, values)) => SqlType::create_type(values)?,
            (_, D::UInt64) => "numeric(20,0)".into(),
            (
                _,
                D::Decimal32(p, s) | D::Decimal64(p, s) | D::Decimal128(p, s) | D::Decimal256(p, s),
            ) if *s >= 0 && *s as u8 <= *p => format!("numeric({p},{s})"),
            (t, _) => t.name().into(),
        })
    }

    /// Its name in messages and in `CREATE TABLE`.
    pub fn name(self) -> &'static str {
        match self {
            SqlType::Bool => "boolean",
            SqlType::Int2 => "smallint",
            SqlType::Int4 => "integer",
            SqlType::Int8 => "bigint",
            SqlType::Float4 => "real",
            SqlType::Float8 => "double precision",
            SqlType::Text => "text",
            SqlType::Bytea => "bytea",
            SqlType::Timestamptz => "timestamptz",
            SqlType::Date => "date",
            SqlType::Time => "time",
            SqlType::Numeric => "numeric",
            SqlType::Jsonb => "jsonb",
        }
    }

    /// The binary form these values are written in for a column whose base type is `found`,
    /// and whether that is the column's own type (so binary COPY can write the column; else
    /// they are staged in that form and cast as [`SqlType::fits`] says). Widening is exact;
    /// narrowing and parsing stay PostgreSQL's (its range and syntax errors).
    pub fn wire(self, found: &str) -> (Wire, bool) {
        let exact = |wire: Wire, types: &[&str]| (wire, types.contains(&found));
        match self {
            SqlType::Bool => exact(Wire::Bool, &["bool"]),
            SqlType::Int2 | SqlType::Int4 | SqlType::Int8 => {
                let own = match self {
                    SqlType::Int2 => Wire::Int2,
                    SqlType::Int4 => Wire::Int4,
                    _ => Wire::Int8,
                };
                let widths = [
                    ("int2", Wire::Int2),
                    ("int4", Wire::Int4),
                    ("int8", Wire::Int8),
                ];
                let rank = |w: Wire| widths.iter().position(|(_, x)| *x == w);
                match widths.iter().find(|(name, _)| *name == found) {
                    Some((_, column)) if rank(*column) >= rank(own) => (*column, true),
                    _ => (own, false),
                }
            }
            SqlType::Float4 => match found {
                "float8" => (Wire::Float8, true),
                _ => exact(Wire::Float4, &["float4"]),
            },
            SqlType::Float8 => exact(Wire::Float8, &["float8"]),
            SqlType::Text => exact(Wire::Text, &["text", "varchar"]),
            SqlType::Bytea => exact(Wire::Bytea, &["bytea"]),
            SqlType::Timestamptz => exact(Wire::Timestamp, &["timestamptz", "timestamp"]),
            SqlType::Date => exact(Wire::Date, &["date"]),
            // Displayed and parsed by PostgreSQL, which rounds nanoseconds its own way.
            SqlType::Time => (Wire::Text, false),
            // Into other columns as text, so that PostgreSQL's parsing decides as before.
            SqlType::Numeric if found == "numeric" => (Wire::Numeric, true),
            SqlType::Numeric => (Wire::Text, false),
            SqlType::Jsonb => exact(Wire::Jsonb, &["jsonb"]),
        }
    }

    /// How these values reach a column whose base type is `found` (`pg_type.typname`), or
    /// `None` when they cannot without loss or guessing.
    pub fn fits(self, found: &str) -> Option<Fit> {
        const INTEGERS: [&str; 6] = ["int2", "int4", "int8", "numeric", "float4", "float8"];
        const TEXT: [&str; 4] = ["text", "varchar", "bpchar", "name"];
        let assign = |types: &[&str]| types.contains(&found).then_some(Fit::Assign);
        // The target names are `pg_type` names, valid as SQL type names.
        let cast =
            |types: &[&'static str]| types.iter().find(|t| **t == found).map(|t| Fit::Cast(t));
        match self {
            SqlType::Bool => assign(&["bool"]),
            SqlType::Int2 | SqlType::Int4 | SqlType::Int8 => assign(&INTEGERS),
            SqlType::Float4 | SqlType::Float8 => assign(&["float4", "float8", "numeric"]),
            SqlType::Text => assign(&TEXT).or_else(|| cast(&["json", "jsonb", "uuid"])),
            SqlType::Bytea => assign(&["bytea"]),
            SqlType::Timestamptz => assign(&["timestamptz", "timestamp"]),
            SqlType::Date => cast(&["date", "timestamp", "timestamptz"]),
            SqlType::Time => cast(&["time"]),
            SqlType::Numeric => cast(&["numeric", "int8", "float8"]),
            SqlType::Jsonb => assign(&["jsonb"]).or_else(|| cast(&["json", "text"])),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use arrow_schema::{Field, Fields, TimeUnit};

    #[test]
    fn arrow_types_map_to_sql_types() {
        let list = DataType::List(Arc::new(Field::new("item", DataType::Float32, true)));
        let cases = [
            (DataType::Boolean, "boolean", "bool"),
            (DataType::Int8, "smallint", "int2"),
            (DataType::UInt8, "smallint", "int2"),
            (DataType::Int16, "smallint", "int2"),
            (DataType::Int32, "integer", "int4"),
            (DataType::UInt16, "integer", "int4"),
            (DataType::Int64, "bigint", "int8"),
            (DataType::UInt32, "bigint", "int8"),
            (DataType::UInt64, "numeric(20,0)", "numeric"),
            (DataType::Float32, "real", "float4"),
            (DataType::Float64, "double precision", "float8"),
            (DataType::Utf8, "text", "text"),
            (DataType::LargeUtf8, "text", "text"),
            (DataType::Binary, "bytea", "bytea"),
            (DataType::FixedSizeBinary(16), "bytea", "bytea"),
            (
                DataType::Timestamp(TimeUnit::Nanosecond, None),
                "timestamptz",
                "timestamptz",
            ),
            (
                DataType::Timestamp(TimeUnit::Millisecond, Some("+02:00".into())),
                "timestamptz",
                "timestamptz",
            ),
            (DataType::Date32, "date", "date"),
            (DataType::Time64(TimeUnit::Microsecond), "time", "text"),
            (DataType::Decimal128(10, 2), "numeric(10,2)", "numeric"),
            (list.clone(), "jsonb", "jsonb"),
            (
                DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), 4),
                "jsonb",
                "jsonb",
            ),
            (
                DataType::Struct(Fields::from(vec![Field::new("a", DataType::Int32, true)])),
                "jsonb",
                "jsonb",
            ),
            (
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                "text",
                "text",
            ),
        ];
        for (arrow, created, sent) in cases {
            assert_eq!(
                SqlType::create_type(&arrow).unwrap(),
                created,
                "{arrow} is created as"
            );
            // The column's `pg_type` name, as the catalog reports it.
            let base = match created.split('(').next().unwrap_or_default() {
                "boolean" => "bool",
                "smallint" => "int2",
                "integer" => "int4",
                "bigint" => "int8",
                "real" => "float4",
                "double precision" => "float8",
                other => other,
            };
            let (wire, own_type) = SqlType::of(&arrow).unwrap().wire(base);
            assert_eq!(wire.type_name(), sent, "{arrow} is sent as");
            assert_eq!(
                own_type,
                base != "time",
                "{arrow} is sent in the created column's own type (times are parsed)"
            );
        }
        let e = SqlType::of(&DataType::Duration(TimeUnit::Second)).unwrap_err();
        assert!(e.contains("Duration"), "{e}");
    }

    #[test]
    fn values_are_sent_in_the_columns_own_type_only_where_nothing_is_lost_or_parsed() {
        assert_eq!(SqlType::Int2.wire("int8"), (Wire::Int8, true), "widened");
        assert_eq!(
            SqlType::Int8.wire("int2"),
            (Wire::Int8, false),
            "narrowed by PostgreSQL, which checks the range"
        );
        assert_eq!(SqlType::Int8.wire("numeric"), (Wire::Int8, false));
        assert_eq!(SqlType::Float4.wire("float8"), (Wire::Float8, true));
        assert_eq!(SqlType::Float8.wire("float4"), (Wire::Float8, false));
        assert_eq!(SqlType::Text.wire("varchar"), (Wire::Text, true));
        assert_eq!(SqlType::Text.wire("jsonb"), (Wire::Text, false));
        assert_eq!(
            SqlType::Timestamptz.wire("timestamp"),
            (Wire::Timestamp, true)
        );
        assert_eq!(SqlType::Date.wire("timestamptz"), (Wire::Date, false));
        assert_eq!(SqlType::Numeric.wire("numeric"), (Wire::Numeric, true));
        assert_eq!(
            SqlType::Numeric.wire("int8"),
            (Wire::Text, false),
            "parsed by PostgreSQL as before"
        );
        assert_eq!(SqlType::Time.wire("time"), (Wire::Text, false));
        assert_eq!(SqlType::Jsonb.wire("json"), (Wire::Jsonb, false));
    }

    #[test]
    fn existing_columns_take_what_fits_and_refuse_the_rest() {
        assert_eq!(SqlType::Int8.fits("int8"), Some(Fit::Assign));
        assert_eq!(SqlType::Int2.fits("int8"), Some(Fit::Assign));
        assert_eq!(SqlType::Int8.fits("numeric"), Some(Fit::Assign));
        assert_eq!(SqlType::Int8.fits("text"), None, "a number is not text");
        assert_eq!(SqlType::Text.fits("varchar"), Some(Fit::Assign));
        assert_eq!(SqlType::Text.fits("jsonb"), Some(Fit::Cast("jsonb")));
        assert_eq!(
            SqlType::Text.fits("int4"),
            None,
            "text is not parsed as a number"
        );
        assert_eq!(
            SqlType::Float8.fits("int8"),
            None,
            "floats are not truncated"
        );
        assert_eq!(SqlType::Bool.fits("int2"), None);
        assert_eq!(SqlType::Timestamptz.fits("timestamp"), Some(Fit::Assign));
        assert_eq!(
            SqlType::Timestamptz.fits("date"),
            None,
            "no silent truncation"
        );
        assert_eq!(SqlType::Date.fits("date"), Some(Fit::Cast("date")));
        assert_eq!(SqlType::Numeric.fits("numeric"), Some(Fit::Cast("numeric")));
        assert_eq!(SqlType::Jsonb.fits("jsonb"), Some(Fit::Assign));
        assert_eq!(SqlType::Jsonb.fits("json"), Some(Fit::Cast("json")));
        assert_eq!(
            SqlType::Jsonb.fits("_float4"),
            None,
            "lists are JSON, not arrays"
        );
        assert_eq!(SqlType::Bytea.fits("text"), None);
    }
}
