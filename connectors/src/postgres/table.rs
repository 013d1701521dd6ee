//! The target table: what the catalog says of it, whether the results fit it (checked before
//! the run, with an error naming the table, the column, the Arrow type and the SQL type found),
//! creating it, and the plan of how batches of one schema are written (binary COPY into the
//! table, or into a staging table and from there with one `INSERT … SELECT`).

use std::sync::Arc;

use arrow_schema::{Schema, SchemaRef};
use postgres::GenericClient;

use super::config::WriteMode;
use super::sql::{self, CopyColumn, NewColumn, Staged, TableName};
use super::types::{Fit, SqlType, Wire};

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
    /// COPY writes rows as INSERT would: a table (plain or partitioned) without row security
    /// or rules (COPY refuses the one and skips the other); not a view or foreign table.
    pub copyable: bool,
}

/// The table as the catalog has it, `None` when it does not exist.
pub fn describe(
    client: &mut impl GenericClient,
    name: &TableName,
) -> Result<Option<Table>, postgres::Error> {
    let Some(row) = client.query_opt(
        "SELECT c.oid, c.relkind IN ('r', 'p') AND NOT c.relrowsecurity AND NOT c.relhasrules \
         FROM pg_class c WHERE c.oid = to_regclass($1)",
        &[&name.quoted()],
    )?
    else {
        return Ok(None);
    };
    let oid: u32 = row.get(0);
    let copyable: bool = row.get(1);
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
        copyable,
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
    /// Each batch column's SQL type and the binary form its values are sent in.
    pub types: Vec<SqlType>,
    pub wires: Vec<Wire>,
    /// `COPY` straight into the table, when every column is sent in its own type and COPY
    /// writes the table as INSERT would. With a key, it is tried first (rows whose key is
    /// present make it fail, and the rows go through `staged` instead).
    pub copy: Option<String>,
    /// Through the staging table `stage`: for a key's `ON CONFLICT`, and for values
    /// PostgreSQL casts.
    pub staged: Option<Staged>,
}

/// Checks that batches of `schema` fit `table` and plans how they are written, staged in the
/// temporary table `stage` when they must be. The error names the table and the column, with
/// the Arrow type and the SQL type found.
pub fn plan(
    table: &Table,
    schema: &SchemaRef,
    key: &[String],
    mode: WriteMode,
    stage: &str,
) -> Result<Plan, String> {
    let t = &table.name;
    let Fitted {
        types,
        fits,
        wires,
        exact,
    } = fit_columns(table, schema)?;
    check_required(table, schema)?;
    check_key(table, schema, key)?;
    let columns: Vec<CopyColumn<'_>> = schema
        .fields()
        .iter()
        .zip(wires.iter().zip(&fits))
        .map(|(f, (wire, fit))| CopyColumn {
            name: f.name(),
            wire_type: wire.type_name(),
            cast: match fit {
                Fit::Assign => None,
                Fit::Cast(to) => Some(*to),
            },
        })
        .collect();
    let staged = (!exact || !key.is_empty())
        .then(|| sql::staged(t, stage, &columns, key, mode == WriteMode::Upsert));
    Ok(Plan {
        schema: Arc::clone(schema),
        types,
        wires,
        copy: exact.then(|| sql::copy_into(t, &columns)),
        staged,
    })
}

/// How each column of the results fits the table's column of its name.
struct Fitted {
    types: Vec<SqlType>,
    fits: Vec<Fit>,
    wires: Vec<Wire>,
    /// Every column is sent in its own type, and COPY writes the table as INSERT would.
    exact: bool,
}

/// Finds each result column's table column and how its values are written there.
fn fit_columns(table: &Table, schema: &SchemaRef) -> Result<Fitted, String> {
    let t = &table.name;
    let mut types = Vec::with_capacity(schema.fields().len());
    let mut fits = Vec::with_capacity(schema.fields().len());
    let mut wires = Vec::with_capacity(schema.fields().len());
    let mut exact = table.copyable;
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
        let (wire, own_type) = sql.wire(&column.base_type);
        exact &= own_type;
        types.push(sql);
        fits.push(fit);
        wires.push(wire);
    }
    Ok(Fitted {
        types,
        fits,
        wires,
        exact,
    })
}

/// Every column a row must give is in the results.
fn check_required(table: &Table, schema: &SchemaRef) -> Result<(), String> {
    if let Some(missing) = table
        .columns
        .iter()
        .find(|c| c.required && schema.field_with_name(&c.name).is_err())
    {
        return Err(format!(
            "column `{}` of table `{}` is NOT NULL without a default, and the results have no \
             such column",
            missing.name, table.name
        ));
    }
    Ok(())
}

/// The `key` columns are in the results, and the table has a primary key or unique index on
/// exactly them (what `ON CONFLICT` needs).
fn check_key(table: &Table, schema: &SchemaRef, key: &[String]) -> Result<(), String> {
    for k in key {
        schema
            .index_of(k)
            .map_err(|_| format!("`key` names column `{k}`, which the results do not have"))?;
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
                 table `{}` (for ON CONFLICT); the table has {}",
                key.join(", "),
                table.name,
                describe_unique(&table.unique)
            ));
        }
    }
    Ok(())
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
            copyable: true,
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
        let p = plan(&table(), &s, &["id".into()], WriteMode::Upsert, "st").unwrap();
        assert_eq!(p.types, [SqlType::Int8, SqlType::Text, SqlType::Text]);
        assert_eq!(p.wires, [Wire::Int8, Wire::Text, Wire::Text]);
        assert_eq!(p.copy, None, "text is cast into jsonb: staged");
        let staged = p.staged.unwrap();
        assert!(staged.insert.contains("s.c3::jsonb"), "{}", staged.insert);
        assert!(
            staged.insert.contains("ON CONFLICT (\"id\") DO UPDATE"),
            "{}",
            staged.insert
        );
    }

    #[test]
    fn columns_in_their_own_types_are_copied_straight_into_a_table() {
        let s = schema(vec![
            Field::new("id", DataType::Int32, false),
            Field::new("name", DataType::Utf8, true),
        ]);
        let p = plan(&table(), &s, &[], WriteMode::Insert, "st").unwrap();
        assert_eq!(p.wires, [Wire::Int8, Wire::Text], "widened to bigint");
        assert_eq!(
            p.copy.as_deref(),
            Some("COPY \"events\" (\"id\", \"name\") FROM STDIN BINARY")
        );
        assert!(p.staged.is_none());
        let keyed = plan(&table(), &s, &["id".into()], WriteMode::Insert, "st").unwrap();
        assert!(
            keyed.copy.is_some() && keyed.staged.is_some(),
            "a key: COPY first, staged when a key is present"
        );
        let view = Table {
            copyable: false,
            ..table()
        };
        let p = plan(&view, &s, &[], WriteMode::Insert, "st").unwrap();
        assert!(
            p.copy.is_none() && p.staged.is_some(),
            "views (and tables with row security or rules) take INSERT"
        );
    }

    #[test]
    fn a_column_of_another_type_is_named_with_both_types() {
        let s = schema(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Float64, true),
        ]);
        let e = plan(&table(), &s, &[], WriteMode::Insert, "st").unwrap_err();
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
        let e = plan(&table(), &s, &[], WriteMode::Insert, "st").unwrap_err();
        assert!(
            e.contains("no column `score`") && e.contains("Float32"),
            "{e}"
        );
        let s = schema(vec![Field::new("name", DataType::Utf8, true)]);
        let e = plan(&table(), &s, &[], WriteMode::Insert, "st").unwrap_err();
        assert!(e.contains("`id`") && e.contains("NOT NULL"), "{e}");
    }

    #[test]
    fn a_key_needs_a_matching_unique_index() {
        let s = schema(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("note", DataType::Utf8, true),
        ]);
        let e = plan(&table(), &s, &["note".into()], WriteMode::Upsert, "st").unwrap_err();
        assert!(e.contains("(note)") && e.contains("(id)"), "{e}");
    }
}
