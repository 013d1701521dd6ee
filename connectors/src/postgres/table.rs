//! The target table: what the catalog says of it, whether the results fit it (checked before
//! the run, with an error naming the table, the column, the Arrow type and the SQL type found),
//! creating it, and the plan of the INSERT for one schema of batches.

use std::sync::Arc;

use arrow_schema::{Schema, SchemaRef};
use postgres::GenericClient;

use super::config::WriteMode;
use super::sql::{self, InsertColumn, NewColumn, TableName};
use super::types::{Fit, SqlType};

/// A column of an existing table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    /// `pg_type.typname` of its type, or of a domain's base type: `int8`, `varchar`, `jsonb`.
    pub base_type: String,
    /// Its type as SQL writes it: `character varying(20)`.
    pub shown_type: String,
    /// NOT NULL without a default (nor identity, nor generated): a row must give it.
    pub required: bool,
}

/// An existing table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    pub name: TableName,
    pub columns: Vec<Column>,
    /// The column sets of its primary key and unique indexes (no expressions or predicates).
    pub unique: Vec<Vec<String>>,
}

/// The table as the catalog has it, `None` when it does not exist.
pub fn describe(
    client: &mut impl GenericClient,
    name: &TableName,
) -> Result<Option<Table>, postgres::Error> {
    let Some(row) = client.query_opt("SELECT to_regclass($1)::oid", &[&name.quoted()])? else {
        return Ok(None);
    };
    let Some(oid) = row.get::<_, Option<u32>>(0) else {
        return Ok(None);
    };
    let columns = client
        .query(
            "SELECT a.attname::text, b.typname::text, format_type(a.atttypid, a.atttypmod), \
                    a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' \
                        AND a.attgenerated = '' \
             FROM pg_attribute a \
             JOIN pg_type t ON t.oid = a.atttypid \
             JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END \
             WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped \
             ORDER BY a.attnum",
            &[&oid],
        )?
        .iter()
        .map(|r| Column {
            name: r.get(0),
            base_type: r.get(1),
            shown_type: r.get(2),
            required: r.get(3),
        })
        .collect();
    let unique = client
        .query(
            "SELECT ARRAY(SELECT a.attname::text FROM unnest(i.indkey) k \
                          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k) \
             FROM pg_index i \
             WHERE i.indrelid = $1 AND i.indisunique AND i.indpred IS NULL \
               AND i.indexprs IS NULL",
            &[&oid],
        )?
        .iter()
        .map(|r| r.get::<_, Vec<String>>(0))
        .collect();
    Ok(Some(Table {
        name: name.clone(),
        columns,
        unique,
    }))
}

/// Creates the table for `schema`, with a primary key on `key`.
pub fn create(
    client: &mut impl GenericClient,
    name: &TableName,
    schema: &Schema,
    key: &[String],
) -> Result<Result<(), String>, postgres::Error> {
    let mut types = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        match SqlType::create_type(field.data_type()) {
            Ok(t) => types.push(t),
            Err(e) => return Ok(Err(format!("column `{}`: {e}", field.name()))),
        }
    }
    let columns: Vec<NewColumn<'_>> = schema
        .fields()
        .iter()
        .zip(&types)
        .map(|(f, t)| NewColumn {
            name: f.name(),
            sql_type: t,
            not_null: key.contains(f.name()),
        })
        .collect();
    client.batch_execute(&sql::create_table(name, &columns, key))?;
    Ok(Ok(()))
}

/// How the batches of one schema are written.
#[derive(Debug)]
pub struct Plan {
    pub schema: SchemaRef,
    pub sql: String,
    /// Each batch column's SQL type, in the order of the statement's parameters.
    pub types: Vec<SqlType>,
    /// Positions of the key columns in the batch, for folding an upsert's repeated keys.
    pub key: Vec<usize>,
    pub mode: WriteMode,
}

/// Checks that batches of `schema` fit `table` and plans their INSERT. The error names the
/// table and the column, with the Arrow type and the SQL type found.
pub fn plan(
    table: &Table,
    schema: &SchemaRef,
    key: &[String],
    mode: WriteMode,
) -> Result<Plan, String> {
    let t = &table.name;
    let mut types = Vec::with_capacity(schema.fields().len());
    let mut fits = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let arrow = field.data_type();
        let sql = SqlType::of(arrow).map_err(|e| format!("column `{}`: {e}", field.name()))?;
        let Some(column) = table.columns.iter().find(|c| c.name == *field.name()) else {
            return Err(format!(
                "table `{t}` has no column `{}` (Arrow type {arrow}, written as {}): add it to \
                 the table, or leave it out of the results with a `select` stage",
                field.name(),
                sql.name()
            ));
        };
        let fit = sql.fits(&column.base_type).ok_or_else(|| {
            format!(
                "column `{}` of table `{t}` is {}, which cannot take the results' Arrow type \
                 {arrow} (written as {}): change the column's type, or cast the results with a \
                 `cast` stage",
                field.name(),
                column.shown_type,
                sql.name()
            )
        })?;
        types.push(sql);
        fits.push(fit);
    }
    if let Some(missing) = table
        .columns
        .iter()
        .find(|c| c.required && schema.field_with_name(&c.name).is_err())
    {
        return Err(format!(
            "column `{}` of table `{t}` is NOT NULL without a default, and the results have no \
             such column",
            missing.name
        ));
    }
    let mut key_positions = Vec::with_capacity(key.len());
    for k in key {
        let at = schema
            .index_of(k)
            .map_err(|_| format!("`key` names column `{k}`, which the results do not have"))?;
        key_positions.push(at);
    }
    if !key.is_empty() {
        let mut wanted: Vec<&str> = key.iter().map(String::as_str).collect();
        wanted.sort_unstable();
        let matches = table.unique.iter().any(|u| {
            let mut have: Vec<&str> = u.iter().map(String::as_str).collect();
            have.sort_unstable();
            have == wanted
        });
        if !matches {
            return Err(format!(
                "`key` ({}) needs a primary key or unique index on exactly these columns of \
                 table `{t}` (for ON CONFLICT); the table has {}",
                key.join(", "),
                describe_unique(&table.unique)
            ));
        }
    }
    let columns: Vec<InsertColumn<'_>> = schema
        .fields()
        .iter()
        .zip(types.iter().zip(&fits))
        .map(|(f, (sql, fit))| InsertColumn {
            name: f.name(),
            param_type: sql.param_type(),
            cast: match fit {
                Fit::Assign => None,
                Fit::Cast(to) => Some(*to),
            },
        })
        .collect();
    Ok(Plan {
        schema: Arc::clone(schema),
        sql: sql::insert(t, &columns, key, mode == WriteMode::Upsert),
        types,
        key: key_positions,
        mode,
    })
}

fn describe_unique(unique: &[Vec<String>]) -> String {
    if unique.is_empty() {
        return "none".into();
    }
    unique
        .iter()
        .map(|u| format!("({})", u.join(", ")))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::{DataType, Field};

    fn column(name: &str, base: &str, shown: &str, required: bool) -> Column {
        Column {
            name: name.into(),
            base_type: base.into(),
            shown_type: shown.into(),
            required,
        }
    }

    fn table() -> Table {
        Table {
            name: TableName::parse("events").unwrap(),
            columns: vec![
                column("id", "int8", "bigint", true),
                column("name", "varchar", "character varying(20)", false),
                column("tags", "jsonb", "jsonb", false),
                column("note", "text", "text", false),
            ],
            unique: vec![vec!["id".into()]],
        }
    }

    fn schema(fields: Vec<Field>) -> SchemaRef {
        Arc::new(Schema::new(fields))
    }

    #[test]
    fn fitting_results_are_planned_with_the_casts_they_need() {
        let s = schema(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("tags", DataType::Utf8, true),
        ]);
        let p = plan(&table(), &s, &["id".into()], WriteMode::Upsert).unwrap();
        assert_eq!(p.types, [SqlType::Int8, SqlType::Text, SqlType::Text]);
        assert_eq!(p.key, [0]);
        assert!(p.sql.contains("u.\"tags\"::jsonb"), "{}", p.sql);
        assert!(
            p.sql.contains("ON CONFLICT (\"id\") DO UPDATE"),
            "{}",
            p.sql
        );
    }

    #[test]
    fn a_column_of_another_type_is_named_with_both_types() {
        let s = schema(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Float64, true),
        ]);
        let e = plan(&table(), &s, &[], WriteMode::Insert).unwrap_err();
        for part in ["`name`", "`events`", "character varying(20)", "Float64"] {
            assert!(e.contains(part), "{part} in: {e}");
        }
    }

    #[test]
    fn a_missing_column_or_required_column_is_an_error() {
        let s = schema(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("score", DataType::Float32, true),
        ]);
        let e = plan(&table(), &s, &[], WriteMode::Insert).unwrap_err();
        assert!(
            e.contains("no column `score`") && e.contains("Float32"),
            "{e}"
        );
        let s = schema(vec![Field::new("name", DataType::Utf8, true)]);
        let e = plan(&table(), &s, &[], WriteMode::Insert).unwrap_err();
        assert!(e.contains("`id`") && e.contains("NOT NULL"), "{e}");
    }

    #[test]
    fn a_key_needs_a_matching_unique_index() {
        let s = schema(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("note", DataType::Utf8, true),
        ]);
        let e = plan(&table(), &s, &["note".into()], WriteMode::Upsert).unwrap_err();
        assert!(e.contains("(note)") && e.contains("(id)"), "{e}");
    }
}
