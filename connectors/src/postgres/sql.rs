//! The SQL the sink sends: quoted names, `CREATE TABLE`, and the INSERT that takes one array
//! per column (`INSERT … SELECT … FROM UNNEST($1::int8[], $2::text[])`), so a statement of
//! any number of rows has one parameter per column.

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

/// A column of the INSERT: its name, the array type its parameter is sent as, and the cast
/// to the table's type where no assignment cast exists (text into `jsonb`).
pub struct InsertColumn<'a> {
    pub name: &'a str,
    pub param_type: &'a str,
    pub cast: Option<&'a str>,
}

/// `INSERT INTO t ("a", "b") SELECT u."a", u."b"::jsonb FROM UNNEST($1::int8[], $2::text[])
/// AS u("a", "b")`, then with a `key` the conflict clause: `update` the other columns (an
/// upsert), or skip the row.
pub fn insert(
    table: &TableName,
    columns: &[InsertColumn<'_>],
    key: &[String],
    update: bool,
) -> String {
    let names: Vec<&str> = columns.iter().map(|c| c.name).collect();
    let mut sql = format!(
        "INSERT INTO {} ({}) SELECT ",
        table.quoted(),
        quoted_list(&names)
    );
    for (i, c) in columns.iter().enumerate() {
        if i > 0 {
            sql.push_str(", ");
        }
        let _ = write!(sql, "u.{}", quote(c.name));
        if let Some(cast) = c.cast {
            let _ = write!(sql, "::{cast}");
        }
    }
    sql.push_str(" FROM UNNEST(");
    for (i, c) in columns.iter().enumerate() {
        if i > 0 {
            sql.push_str(", ");
        }
        let _ = write!(sql, "${}::{}[]", i + 1, c.param_type);
    }
    let _ = write!(sql, ") AS u({})", quoted_list(&names));
    if key.is_empty() {
        return sql;
    }
    let _ = write!(sql, " ON CONFLICT ({})", quoted_list(key));
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

    fn columns() -> [InsertColumn<'static>; 3] {
        [
            InsertColumn {
                name: "id",
                param_type: "int8",
                cast: None,
            },
            InsertColumn {
                name: "name",
                param_type: "text",
                cast: None,
            },
            InsertColumn {
                name: "tags",
                param_type: "text",
                cast: Some("jsonb"),
            },
        ]
    }

    #[test]
    fn inserts_take_one_array_per_column() {
        let t = TableName::parse("s.t").unwrap();
        assert_eq!(
            insert(&t, &columns(), &[], false),
            "INSERT INTO \"s\".\"t\" (\"id\", \"name\", \"tags\") SELECT u.\"id\", u.\"name\", \
             u.\"tags\"::jsonb FROM UNNEST($1::int8[], $2::text[], $3::text[]) AS u(\"id\", \
             \"name\", \"tags\")"
        );
        assert!(
            insert(&t, &columns(), &["id".into()], false)
                .ends_with(" ON CONFLICT (\"id\") DO NOTHING"),
            "insert with a key skips rows whose key is present"
        );
    }

    #[test]
    fn upserts_update_every_column_but_the_key() {
        let t = TableName::parse("t").unwrap();
        let sql = insert(&t, &columns(), &["id".into()], true);
        assert!(
            sql.ends_with(
                " ON CONFLICT (\"id\") DO UPDATE SET \"name\" = EXCLUDED.\"name\", \"tags\" = \
                 EXCLUDED.\"tags\""
            ),
            "{sql}"
        );
        let all_key = insert(&t, &columns()[..1], &["id".into()], true);
        assert!(
            all_key.ends_with("DO NOTHING"),
            "nothing to update: {all_key}"
        );
    }
}
