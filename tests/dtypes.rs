//! float16, bool and 16/32/64-bit integer tensors in and out of the `model` stage, and the
//! `cast` stage that matches a source's columns to a model's types. The models are tiny graphs
//! made here with the `onnx` Python package that scripts/setup.sh installs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use arrow_array::types::{ArrowPrimitiveType, Float32Type};
use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use common::*;
use riffle_dataflow::tensor::{tensor_column, tensor_field};

/// Makes the test models in `dir`:
/// - `half.onnx`: `x` float16[N] → `y` = 2x, float16[N];
/// - `half3.onnx`: the same over float16[N,3];
/// - `bools.onnx`: `x` float32[N] → `gt` = x > 0.5, `flag` bool[N] → `not` = ¬flag;
/// - `ints.onnx`: `a` int32 → a + 1, `b` int16 → b + 1, and uint16 `c`, uint32 `d`, uint64 `e`
///   returned as they came (all [N]).
fn make_models(dir: &Path) -> PathBuf {
    let python = cache_dir().join("python");
    assert!(
        python.join("onnx").is_dir(),
        "the onnx Python package is missing from {}: run scripts/setup.sh",
        python.display()
    );
    let script = r#"
import sys, onnx
from onnx import helper as h, TensorProto as T
out = sys.argv[1]

def save(name, nodes, inputs, outputs, inits=()):
    g = h.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, f"{out}/{name}.onnx")

def io(name, ty, dims=("N",)):
    return h.make_tensor_value_info(name, ty, list(dims))

for name, dims in [("half", ("N",)), ("half3", ("N", 3))]:
    save(name, [
        h.make_node("Cast", ["x"], ["xf"], to=T.FLOAT),
        h.make_node("Mul", ["xf", "two"], ["yf"]),
        h.make_node("Cast", ["yf"], ["y"], to=T.FLOAT16),
    ], [io("x", T.FLOAT16, dims)], [io("y", T.FLOAT16, dims)],
       [h.make_tensor("two", T.FLOAT, [], [2.0])])

save("bools", [
    h.make_node("Greater", ["x", "half"], ["gt"]),
    h.make_node("Not", ["flag"], ["not"]),
], [io("x", T.FLOAT), io("flag", T.BOOL)], [io("gt", T.BOOL), io("not", T.BOOL)],
   [h.make_tensor("half", T.FLOAT, [], [0.5])])

save("ints", [
    h.make_node("Add", ["a", "one"], ["a1"]),
    h.make_node("Cast", ["b"], ["b32"], to=T.INT32),
    h.make_node("Add", ["b32", "one"], ["b33"]),
    h.make_node("Cast", ["b33"], ["b1"], to=T.INT16),
    h.make_node("Identity", ["c"], ["c1"]),
    h.make_node("Identity", ["d"], ["d1"]),
    h.make_node("Identity", ["e"], ["e1"]),
], [io("a", T.INT32), io("b", T.INT16), io("c", T.UINT16), io("d", T.UINT32), io("e", T.UINT64)],
   [io("a1", T.INT32), io("b1", T.INT16), io("c1", T.UINT16), io("d1", T.UINT32),
    io("e1", T.UINT64)],
   [h.make_tensor("one", T.INT32, [], [1])])
"#;
    let status = Command::new("python3")
        .args(["-c", script])
        .arg(dir)
        .env("PYTHONPATH", &python)
        .status()
        .unwrap();
    assert!(status.success(), "making the test models");
    dir.to_path_buf()
}

#[test]
fn float16_bool_and_int_columns_through_cast_and_models() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let models = make_models(tmp.path());
    let input = write(
        tmp.path(),
        "in.jsonl",
        concat!(
            r#"{"id":1,"score":0.25,"p":0.2,"flag":true,"a":1,"b":-2,"c":3,"d":4,"e":5}"#,
            "\n",
            r#"{"id":2,"score":1.5,"p":0.7,"flag":false,"a":-10,"b":40000,"c":0,"d":0,"e":0}"#,
            "\n",
            r#"{"id":3,"score":-3.0,"p":0.9,"flag":false,"a":2147483646,"b":32766,"c":65535,"d":4294967295,"e":9007199254740993}"#,
            "\n",
        ),
    );
    let out = tmp.path().join("out.jsonl");
    let pipeline = format!(
        r#"
source:
  jsonl: {{ path: "{input}" }}
stages:
  - cast: {{ columns: {{ score: float16, p: float32, a: int32, b: int16, c: uint16, d: uint32, e: uint64 }} }}
  - model: {{ path: "{models}/half.onnx", inputs: {{ x: score }}, outputs: {{ y: doubled }} }}
  - model: {{ path: "{models}/bools.onnx", inputs: {{ x: p, flag: flag }}, outputs: {{ gt: gt, not: not }} }}
  - model:
      path: "{models}/ints.onnx"
      inputs: {{ a: a, b: b, c: c, d: d, e: e }}
      outputs: {{ a1: a1, b1: b1, c1: c1, d1: d1, e1: e1 }}
sink:
  jsonl: {{ path: "{out}" }}
runtime: {{ workers: 1 }}
"#,
        input = input.display(),
        models = models.display(),
        out = out.display(),
    );
    let p = write(tmp.path(), "p.yaml", &pipeline);
    let validated = riffle_ok(&["validate", p.to_str().unwrap()]);
    let schemas = String::from_utf8_lossy(&validated.stdout);
    assert!(schemas.contains("Float16"), "{schemas}");
    riffle_ok(&["run", "-q", p.to_str().unwrap()]);

    let mut rows = read_jsonl(&out);
    rows.sort_by_key(|r| r["id"].as_i64().unwrap());
    // Row 2's `b` (40000) does not fit an int16: a dead letter, not a result.
    let ids: Vec<i64> = rows.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, [1, 3]);
    let dead = read_jsonl(&tmp.path().join("out.dead-letters.jsonl"));
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0]["stage"], "cast");
    assert_eq!(dead[0]["reason"], "column `b`: cannot cast 40000 to int16");
    assert!(
        dead[0]["record"].as_str().unwrap().contains(r#""id":2"#),
        "{dead:?}"
    );

    let (first, third) = (&rows[0], &rows[1]);
    assert_eq!(first["doubled"].as_f64(), Some(0.5));
    assert_eq!(third["doubled"].as_f64(), Some(-6.0));
    assert_eq!(
        (first["gt"].as_bool(), first["not"].as_bool()),
        (Some(false), Some(false))
    );
    assert_eq!(
        (third["gt"].as_bool(), third["not"].as_bool()),
        (Some(true), Some(true))
    );
    assert_eq!(first["a1"], 2);
    assert_eq!(first["b1"], -1);
    assert_eq!(
        (&first["c1"], &first["d1"], &first["e1"]),
        (&3.into(), &4.into(), &5.into())
    );
    assert_eq!(third["a1"], 2147483647);
    assert_eq!(third["b1"], 32767);
    assert_eq!(third["c1"], 65535);
    assert_eq!(third["d1"], 4294967295u64);
    assert_eq!(third["e1"], 9007199254740993u64);
    // The model inputs were dropped (`keep_inputs: false`).
    assert!(
        first.get("score").is_none() && first.get("a").is_none(),
        "{first}"
    );
}

#[test]
fn a_float32_tensor_cast_to_float16_runs_a_float16_model() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let models = make_models(tmp.path());
    // An IPC file with a [3] float32 tensor column (the shape in its field metadata).
    let ids = Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef;
    let field = tensor_field("x", Float32Type::DATA_TYPE, &[3]);
    let x = tensor_column::<Float32Type>(&field, vec![0.5, 1.0, -2.0, 100.0, 0.125, 3.0]).unwrap();
    let plain = RecordBatch::try_from_iter(vec![("id", ids.clone()), ("x", x.clone())]).unwrap();
    let mut schema = plain.schema().as_ref().clone();
    schema.fields = vec![plain.schema().field(0).clone(), field].into();
    let batch = RecordBatch::try_new(Arc::new(schema), vec![ids, x]).unwrap();
    let input = tmp.path().join("in.arrow");
    let mut writer = arrow_ipc::writer::FileWriter::try_new(
        std::fs::File::create(&input).unwrap(),
        &batch.schema(),
    )
    .unwrap();
    writer.write(&batch).unwrap();
    writer.finish().unwrap();

    let out = tmp.path().join("out.jsonl");
    let pipeline = |cast: &str| {
        format!(
            r#"
source:
  ipc: {{ path: "{input}" }}
stages:{cast}
  - model: {{ path: "{models}/half3.onnx", inputs: {{ x: x }}, outputs: {{ y: doubled }} }}
sink:
  jsonl: {{ path: "{out}" }}
"#,
            input = input.display(),
            models = models.display(),
            out = out.display(),
        )
    };
    let p = write(
        tmp.path(),
        "p.yaml",
        &pipeline("\n  - cast: { columns: { x: float16 } }"),
    );
    riffle_ok(&["run", "-q", p.to_str().unwrap()]);
    let mut rows = read_jsonl(&out);
    rows.sort_by_key(|r| r["id"].as_i64().unwrap());
    let y: Vec<Vec<f64>> = rows
        .iter()
        .map(|r| {
            r["doubled"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(y, [vec![1.0, 2.0, -4.0], vec![200.0, 0.25, 6.0]]);

    // Without the cast, validation says the model wants float16.
    let p = write(tmp.path(), "uncast.yaml", &pipeline(""));
    let refused = riffle(&["validate", p.to_str().unwrap()]);
    assert!(!refused.status.success());
    let e = String::from_utf8_lossy(&refused.stderr);
    let line = line_of(&p, "model:");
    assert!(
        e.contains(&format!("uncast.yaml:{line}:")) && e.contains("model.inputs.x"),
        "{e}"
    );
    assert!(
        e.contains("column `x`: expected Float16[?,3] for model input `x`, found Float32"),
        "{e}"
    );
}

#[test]
fn cast_config_errors_name_the_column_or_the_accepted_types() {
    let tmp = tempfile::tempdir().unwrap();
    let input = write(tmp.path(), "in.jsonl", "{\"id\":1,\"score\":0.5}\n");
    let pipeline = |columns: &str| {
        format!(
            "source:\n  jsonl: {{ path: \"{}\" }}\nstages:\n  - cast:\n      columns: {{ {columns} }}\n\
             sink:\n  stdout: {{}}\n",
            input.display()
        )
    };
    let p = write(tmp.path(), "unknown.yaml", &pipeline("scroe: float16"));
    let out = riffle(&["validate", p.to_str().unwrap()]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("stages[0].cast.columns.scroe") && e.contains("no such column"),
        "{e}"
    );
    assert!(e.contains("id, score"), "{e}");

    let p = write(tmp.path(), "type.yaml", &pipeline("score: half"));
    let out = riffle(&["validate", p.to_str().unwrap()]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("unknown variant `half`"), "{e}");
    assert!(
        e.contains("float16") && e.contains("uint64") && e.contains("bool"),
        "{e}"
    );
}
