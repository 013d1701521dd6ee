use super::*;
use arrow_array::builder::{ListBuilder, PrimitiveBuilder};
use arrow_array::types::{Float32Type, Float64Type, Int64Type};
use arrow_array::{Float64Array, Int64Array, StringArray};
use riffle_dataflow::tensor::{row_shape, tensor_column};

fn config(json: serde_json::Value) -> TensorConfig {
    serde_json::from_value(json).unwrap()
}

fn run(json: serde_json::Value, batch: &RecordBatch) -> StageOutput {
    let mut stage = Tensor::new(config(json)).unwrap();
    let expected = stage.output_schema(batch.schema_ref()).unwrap();
    let out = stage.process_batch(batch).unwrap();
    assert_eq!(out.records.schema(), expected);
    out
}

fn values_f32(batch: &RecordBatch, name: &str) -> Vec<f32> {
    let list = batch.column_by_name(name).unwrap().as_fixed_size_list();
    list.values()
        .as_primitive::<Float32Type>()
        .values()
        .to_vec()
}

fn wide() -> RecordBatch {
    RecordBatch::try_from_iter(vec![
        ("id", Arc::new(Int64Array::from(vec![1, 2, 3])) as ArrayRef),
        (
            "aff_1",
            Arc::new(Float64Array::from(vec![0.1, 0.2, 0.3])) as _,
        ),
        (
            "other",
            Arc::new(StringArray::from(vec!["a", "b", "c"])) as _,
        ),
        (
            "aff_0",
            Arc::new(Int64Array::from(vec![Some(1), Some(2), None])) as _,
        ),
    ])
    .unwrap()
}

#[test]
fn a_prefix_takes_columns_in_input_order_and_nulls_are_dead_letters() {
    let out = run(
        serde_json::json!({ "output": "aff", "columns_prefix": "aff_" }),
        &wide(),
    );
    let names: Vec<String> = out
        .records
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["id", "other", "aff"]);
    assert_eq!(values_f32(&out.records, "aff"), [0.1, 1.0, 0.2, 2.0]);
    assert_eq!(row_shape(out.records.schema().field(2)).unwrap(), [2]);
    assert_eq!(out.rejected.len(), 1);
    assert_eq!(out.rejected[0].reason, "column `aff_0` is null");
    assert!(out.rejected[0].record.contains(r#""id":3"#));

    // Kept inputs, another dtype.
    let out = run(
        serde_json::json!({
            "output": "aff", "columns": ["aff_0", "aff_1"], "dtype": "float64",
            "drop_inputs": false,
        }),
        &wide(),
    );
    assert_eq!(out.records.num_columns(), 5);
    let list = out.records.column(4).as_fixed_size_list();
    assert_eq!(
        list.values()
            .as_primitive::<Float64Type>()
            .values()
            .as_ref(),
        &[1.0, 0.1, 2.0, 0.2]
    );
}

#[test]
fn nan_for_an_integer_tensor_and_text_are_dead_letters() {
    let batch = RecordBatch::try_from_iter(vec![
        (
            "a",
            Arc::new(Float64Array::from(vec![1.0, f64::NAN, 3.0])) as ArrayRef,
        ),
        ("b", Arc::new(StringArray::from(vec!["4", "5", "six"])) as _),
    ])
    .unwrap();
    let out = run(
        serde_json::json!({ "output": "t", "columns": ["a", "b"], "dtype": "int64" }),
        &batch,
    );
    let list = out.records.column(0).as_fixed_size_list();
    assert_eq!(
        list.values().as_primitive::<Int64Type>().values().as_ref(),
        &[1, 4]
    );
    let reasons: Vec<&str> = out.rejected.iter().map(|l| l.reason.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "column `a`: \"NaN\" is not a valid int64",
            "column `b`: \"six\" is not a valid int64"
        ]
    );
}

fn lists(rows: Vec<Option<Vec<Option<f64>>>>) -> RecordBatch {
    let n = rows.len();
    let mut builder = ListBuilder::new(PrimitiveBuilder::<Float64Type>::new());
    for row in rows {
        builder.append_option(row);
    }
    RecordBatch::try_from_iter(vec![
        (
            "id",
            Arc::new(Int64Array::from_iter_values(0..n as i64)) as ArrayRef,
        ),
        ("aff", Arc::new(builder.finish()) as _),
    ])
    .unwrap()
}

#[test]
fn list_rows_of_the_wrong_length_or_with_nulls_are_dead_letters() {
    let batch = lists(vec![
        Some(vec![Some(1.0), Some(2.0), Some(3.0)]),
        Some(vec![Some(1.0), Some(2.0)]),
        None,
        Some(vec![Some(4.0), None, Some(6.0)]),
        Some(vec![Some(7.0), Some(8.0), Some(9.0)]),
    ]);
    let out = run(
        serde_json::json!({ "output": "aff", "from": "aff", "length": 3 }),
        &batch,
    );
    assert_eq!(
        values_f32(&out.records, "aff"),
        [1.0, 2.0, 3.0, 7.0, 8.0, 9.0]
    );
    let ids = out.records.column(0).as_primitive::<Int64Type>();
    assert_eq!(ids.values().as_ref(), &[0, 4]);
    let reasons: Vec<&str> = out.rejected.iter().map(|l| l.reason.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "column `aff` has 2 values, expected 3",
            "column `aff` is null",
            "column `aff` element 1 is null",
        ]
    );
    // A sliced batch reads its own rows.
    let out = run(
        serde_json::json!({ "output": "t", "from": "aff", "length": 3 }),
        &batch.slice(3, 2),
    );
    assert_eq!(values_f32(&out.records, "t"), [7.0, 8.0, 9.0]);
    assert_eq!(out.rejected.len(), 1);
}

#[test]
fn a_fixed_size_list_converts_and_its_length_must_agree() {
    let field = tensor_field("v", DataType::Float64, &[2]);
    let column = tensor_column::<Float64Type>(&field, vec![1.0, 2.0, 3.0, 4.0]).unwrap();
    let batch = RecordBatch::try_new(Arc::new(Schema::new(vec![field])), vec![column]).unwrap();
    let out = run(serde_json::json!({ "output": "w", "from": "v" }), &batch);
    assert_eq!(values_f32(&out.records, "w"), [1.0, 2.0, 3.0, 4.0]);
    let out = run(
        serde_json::json!({ "output": "w", "from": "v" }),
        &batch.slice(1, 1),
    );
    assert_eq!(values_f32(&out.records, "w"), [3.0, 4.0]);

    let stage = Tensor::new(config(
        serde_json::json!({ "output": "w", "from": "v", "length": 3 }),
    ))
    .unwrap();
    let e = stage.output_schema(batch.schema_ref()).unwrap_err();
    assert_eq!(e.located().0, Some("length"));
}

#[test]
fn config_errors_are_located_at_their_key() {
    let at = |json: serde_json::Value| -> Option<String> {
        Tensor::new(config(json))
            .err()
            .and_then(|e| e.located().0.map(str::to_string))
    };
    assert_eq!(
        at(serde_json::json!({ "output": "t", "columns": [], })),
        Some("columns".into())
    );
    assert_eq!(
        at(serde_json::json!({ "output": "t", "columns": ["a"], "from": "b" })),
        Some("from".into())
    );
    assert_eq!(
        at(serde_json::json!({ "output": "t", "columns": ["a", "a"] })),
        Some("columns[1]".into())
    );
    assert_eq!(
        at(serde_json::json!({ "output": "t", "columns": ["a"], "length": 2 })),
        Some("length".into())
    );
    assert_eq!(
        at(serde_json::json!({ "output": "t" })),
        Some("columns".into())
    );
    assert!(serde_json::from_value::<TensorConfig>(
        serde_json::json!({ "output": "t", "colums": ["a"] })
    )
    .is_err());

    let schema = wide().schema();
    let check = |json: serde_json::Value| {
        let e = Tensor::new(config(json))
            .unwrap()
            .output_schema(&schema)
            .unwrap_err();
        (
            e.located().0.map(str::to_string),
            crate::unlocated(e).to_string(),
        )
    };
    let (key, message) = check(serde_json::json!({ "output": "t", "columns": ["id", "nope"] }));
    assert_eq!(key.as_deref(), Some("columns[1]"));
    assert!(message.contains("no such column"), "{message}");
    let (key, _) = check(serde_json::json!({ "output": "t", "columns_prefix": "zz" }));
    assert_eq!(key.as_deref(), Some("columns_prefix"));
    let (key, _) = check(serde_json::json!({ "output": "id", "columns": ["aff_1"] }));
    assert_eq!(key.as_deref(), Some("output"));
    let (key, _) = check(serde_json::json!({ "output": "t", "from": "aff_1", "length": 2 }));
    assert_eq!(key.as_deref(), Some("from"));
    let (key, message) = check(serde_json::json!({ "output": "t", "from": "x" }));
    assert_eq!(key.as_deref(), Some("from"));
    assert!(message.contains("no such column"), "{message}");
    // A List column needs `length`.
    let e = Tensor::new(config(serde_json::json!({ "output": "t", "from": "aff" })))
        .unwrap()
        .output_schema(&lists(vec![None]).schema())
        .unwrap_err();
    assert_eq!(e.located().0, Some("length"));
}
