//! The SQL the sink sends: quoted names, `CREATE TABLE`, binary `COPY` straight into the
//! table, and the staging table with its `INSERT … SELECT … ON CONFLICT` for keys and casts.

use std::fmt::Write as _;

/// Longest identifier PostgreSQL keeps (longer ones are cut silently, so two long names could
/// become one).
const MAX_IDENTIFIER_BYTES: usize = 63;

/// `table` or `schema.table`, as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableName {
    pub schema: Option<String>,
    pub name: String,
}

impl TableName {
    pub fn parse(text: &str) -> Result<TableName, String> {
        let parts: Vec<&str> = text.split('.').collect();
        let (schema, name) = match parts.as_slice() {
            [name] => (None, *name),
            [schema, name] => (Some(*schema), *name),
            _ => {
                return Err(format!(
                    "expected `table` or `schema.table`, found `{text}`"
                ))
            }
        };
        for part in schema.iter().chain([&name]) {
            check_identifier(part).map_err(|e| format!("`{text}`: {e}"))?;
        }
        Ok(TableName {
            schema: schema.map(str::to_string),
            name: name.to_string(),
        })
    }

    /// The quoted name, for SQL text.
    pub fn quoted(&self) -> String {
        match &self.schema {
            Some(s) => format!("{}.{}", quote(s), quote(&self.name)),
            None => quote(&self.name),
        }
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.schema {
            Some(s) => write!(f, "{s}.{}", self.name),
            None => write!(f, "{}", self.name),
        }
    }
}

/// A name PostgreSQL keeps as it is.
pub fn check_identifier(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a name is empty".into());
    }
    if name.len() > MAX_IDENTIFIER_BYTES {
        return Err(format!(
            "`{name}` is longer than PostgreSQL's {MAX_IDENTIFIER_BYTES} bytes"
        ));
    }
    if name.contains('\0') {
        return Err(format!("`{name}` holds a NUL character"));
    }
    Ok(())
}

/// `"name"`, with inner quotes doubled.
pub fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A column of `CREATE TABLE`.
pub struct NewColumn<'a> {
    pub name: &'a str,
    pub sql_type: &'a str,
    pub not_null: bool,
}

/// `CREATE TABLE IF NOT EXISTS` with a primary key on `key` (none when empty).
pub fn create_table(table: &TableName, columns: &[NewColumn<'_>], key: &[String]) -> String {
    let mut parts: Vec<String> = columns
        .iter()
        .map(|c| {
            let null = if c.not_null { " NOT NULL" } else { "" };
            format!("{} {}{null}", quote(c.name), c.sql_type)
        })
        .collect();
    if !key.is_empty() {
        parts.push(format!("PRIMARY KEY ({})", quoted_list(key)));
    }
    format!(
        "CREATE TABLE IF NOT EXISTS {} ({})",
        table.quoted(),
        parts.join(", ")
    )
}

/// A column written by COPY: its name, the SQL type of the form its values are sent in, and
/// the cast to the table's type where no assignment cast exists (text into `jsonb`).
pub struct CopyColumn<'a> {
    pub name: &'a str,
    pub wire_type: &'a str,
    pub cast: Option<&'a str>,
}

/// `COPY t ("a", "b") FROM STDIN BINARY`: rows straight into the table.
pub fn copy_into(table: &TableName, columns: &[CopyColumn<'_>]) -> String {
    let names: Vec<&str> = columns.iter().map(|c| c.name).collect();
    format!(
        "COPY {} ({}) FROM STDIN BINARY",
        table.quoted(),
        quoted_list(&names)
    )
}

/// The statements of rows staged in a temporary table of this session before they reach the
/// table: for a key's `ON CONFLICT`, and for values PostgreSQL casts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    /// Creates the staging table once per connection: a column per result column, in the
    /// form its values are sent in, and their order of arrival; emptied at each commit.
    pub create: String,
    pub copy: String,
    /// Moves the staged rows into the table.
    pub insert: String,
    /// Empties it within a transaction that stages twice.
    pub empty: String,
}

/// Staging through `pg_temp.<stage>`: `INSERT INTO t ("a", "b") SELECT s.c1, s.c2::jsonb FROM
/// pg_temp.<stage> s ORDER BY s.ord` in arrival order; with a `key`, the conflict clause:
/// skip rows whose key is present (the first of a key wins), or `update` the other columns,
/// from the last staged row of each key (`DISTINCT ON`).
pub fn staged(
    table: &TableName,
    stage: &str,
    columns: &[CopyColumn<'_>],
    key: &[String],
    update: bool,
) -> Staged {
    let stage = format!("pg_temp.{}", quote(stage));
    let mut defs = String::new();
    let mut staged = Vec::with_capacity(columns.len());
    let mut values = Vec::with_capacity(columns.len());
    for (i, c) in columns.iter().enumerate() {
        let _ = write!(defs, "c{} {}, ", i + 1, c.wire_type);
        staged.push(format!("c{}", i + 1));
        values.push(match c.cast {
            Some(cast) => format!("s.c{}::{cast}", i + 1),
            None => format!("s.c{}", i + 1),
        });
    }
    let create = format!(
        "CREATE TEMP TABLE {stage} ({defs}ord bigint GENERATED ALWAYS AS IDENTITY) \
         ON COMMIT DELETE ROWS"
    );
    let copy = format!("COPY {stage} ({}) FROM STDIN BINARY", staged.join(", "));
    let names: Vec<&str> = columns.iter().map(|c| c.name).collect();
    let mut insert = format!(
        "INSERT INTO {} ({}) SELECT ",
        table.quoted(),
        quoted_list(&names)
    );
    let key_values: Vec<&str> = key
        .iter()
        .filter_map(|k| names.iter().position(|n| n == k))
        .filter_map(|i| values.get(i).map(String::as_str))
        .collect();
    if update {
        let _ = write!(insert, "DISTINCT ON ({}) ", key_values.join(", "));
    }
    let _ = write!(insert, "{} FROM {stage} s ORDER BY ", values.join(", "));
    if update {
        let _ = write!(insert, "{}, s.ord DESC", key_values.join(", "));
    } else {
        insert.push_str("s.ord");
    }
    insert.push_str(&on_conflict(&names, key, update));
    Staged {
        create,
        copy,
        insert,
        empty: format!("TRUNCATE {stage}"),
    }
}

/// ` ON CONFLICT (key) DO NOTHING`, or `DO UPDATE SET` every other column for an upsert;
/// nothing without a key.
fn on_conflict(names: &[&str], key: &[String], update: bool) -> String {
    if key.is_empty() {
        return String::new();
    }
    let mut sql = format!(" ON CONFLICT ({})", quoted_list(key));
    let updates: Vec<String> = names
        .iter()
        .filter(|n| !key.iter().any(|k| k == *n))
        .map(|n| format!("{q} = EXCLUDED.{q}", q = quote(n)))
        .collect();
    if !update || updates.is_empty() {
        sql.push_str(" DO NOTHING");
    } else {
        let _ = write!(sql, " DO UPDATE SET {}", updates.join(", "));
    }
    sql
}

fn quoted_list<S: AsRef<str>>(names: &[S]) -> String {
    names
        .iter()
        .map(|n| quote(n.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_split_checked_and_quoted() {
        let t = TableName::parse("analytics.Events").unwrap();
        assert_eq!(t.quoted(), "\"analytics\".\"Events\"");
        assert_eq!(t.to_string(), "analytics.Events");
        assert_eq!(TableName::parse("a\"b").unwrap().quoted(), "\"a\"\"b\"");
        assert!(TableName::parse("a.b.c")
            .unwrap_err()
            .contains("schema.table"));
        assert!(TableName::parse("a.").unwrap_err().contains("empty"));
        assert!(TableName::parse(&"x".repeat(64))
            .unwrap_err()
            .contains("63"));
    }

    #[test]
    fn create_table_has_the_key_as_primary_key() {
        let t = TableName::parse("events").unwrap();
        let columns = [
            NewColumn {
                name: "id",
                sql_type: "bigint",
                not_null: true,
            },
            NewColumn {
                name: "tags",
                sql_type: "jsonb",
                not_null: false,
            },
        ];
        assert_eq!(
            create_table(&t, &columns, &["id".into()]),
            "CREATE TABLE IF NOT EXISTS \"events\" (\"id\" bigint NOT NULL, \"tags\" jsonb, \
             PRIMARY KEY (\"id\"))"
        );
        assert!(!create_table(&t, &columns, &[]).contains("PRIMARY KEY"));
    }

    fn columns() -> [CopyColumn<'static>; 3] {
        [
            CopyColumn {
                name: "id",
                wire_type: "int8",
                cast: None,
            },
            CopyColumn {
                name: "name",
                wire_type: "text",
                cast: None,
            },
            CopyColumn {
                name: "tags",
                wire_type: "text",
                cast: Some("jsonb"),
            },
        ]
    }

    #[test]
    fn rows_are_copied_straight_into_the_table() {
        let t = TableName::parse("s.t").unwrap();
        assert_eq!(
            copy_into(&t, &columns()),
            "COPY \"s\".\"t\" (\"id\", \"name\", \"tags\") FROM STDIN BINARY"
        );
    }

    #[test]
    fn staged_rows_are_cast_and_inserted_in_order() {
        let t = TableName::parse("s.t").unwrap();
        let s = staged(&t, "riffle_stage_1", &columns(), &[], false);
        assert_eq!(
            s.create,
            "CREATE TEMP TABLE pg_temp.\"riffle_stage_1\" (c1 int8, c2 text, c3 text, ord bigint \
             GENERATED ALWAYS AS IDENTITY) ON COMMIT DELETE ROWS"
        );
        assert_eq!(
            s.copy,
            "COPY pg_temp.\"riffle_stage_1\" (c1, c2, c3) FROM STDIN BINARY"
        );
        assert_eq!(
            s.insert,
            "INSERT INTO \"s\".\"t\" (\"id\", \"name\", \"tags\") SELECT s.c1, s.c2, s.c3::jsonb \
             FROM pg_temp.\"riffle_stage_1\" s ORDER BY s.ord"
        );
        let keyed = staged(&t, "riffle_stage_1", &columns(), &["id".into()], false);
        assert!(
            keyed
                .insert
                .ends_with(" ORDER BY s.ord ON CONFLICT (\"id\") DO NOTHING"),
            "insert with a key skips rows whose key is present, the first of a key wins: {}",
            keyed.insert
        );
    }

    #[test]
    fn upserts_update_every_column_but_the_key_from_the_last_row_of_each_key() {
        let t = TableName::parse("t").unwrap();
        let sql = staged(&t, "st", &columns(), &["tags".into()], true).insert;
        assert!(
            sql.contains("SELECT DISTINCT ON (s.c3::jsonb) s.c1, s.c2, s.c3::jsonb FROM"),
            "{sql}"
        );
        assert!(
            sql.ends_with(
                " ORDER BY s.c3::jsonb, s.ord DESC ON CONFLICT (\"tags\") DO UPDATE SET \"id\" = \
                 EXCLUDED.\"id\", \"name\" = EXCLUDED.\"name\""
            ),
            "{sql}"
        );
        let all_key = staged(&t, "st", &columns()[..1], &["id".into()], true).insert;
        assert!(
            all_key.ends_with("DO NOTHING"),
            "nothing to update: {all_key}"
        );
    }
}
