//! A/B variants (sticky per key, by weight) and a shadow model (a sample, off the main path),
//! on the MovieLens click model: the candidate is the same model with its output halved, so
//! every row shows which model served it.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// The click model with `p_click` multiplied by `factor` (made with the `onnx` package).
fn scaled_model(tmp: &Path, factor: f64) -> PathBuf {
    let python = cache_dir().join("python");
    assert!(
        python.join("onnx").is_dir(),
        "the onnx Python package is missing from {}: run scripts/setup.sh",
        python.display()
    );
    let out = tmp.join(format!("ctr_x{factor}.onnx"));
    let script = format!(
        "import onnx, sys\n\
         from onnx import helper, TensorProto\n\
         m = onnx.load(sys.argv[1])\n\
         g = m.graph\n\
         for n in g.node:\n\
         \x20   n.output[:] = ['p_raw' if o == 'p_click' else o for o in n.output]\n\
         g.initializer.append(helper.make_tensor('factor', TensorProto.FLOAT, [], [{factor}]))\n\
         g.node.append(helper.make_node('Mul', ['p_raw', 'factor'], ['p_click']))\n\
         onnx.save(m, sys.argv[2])\n"
    );
    let status = Command::new("python3")
        .args(["-c", &script])
        .arg(model("ml100k_ncf_ctr.onnx"))
        .arg(&out)
        .env("PYTHONPATH", &python)
        .status()
        .unwrap();
    assert!(status.success(), "making the scaled model");
    out
}

fn ratings() -> PathBuf {
    let path = repo().join("data/ml-100k/ratings-20k.csv");
    assert!(
        path.is_file(),
        "{} is missing: run scripts/setup.sh",
        path.display()
    );
    path
}

fn pipeline(out: &Path, model_block: &str) -> String {
    format!(
        r#"
name: ab
source: {{ csv: {{ path: "{ratings}", batch_size: 500 }} }}
stages:
  - model:
      path: "{control}"
      inputs: {{ user_id: user_id, item_id: item_id }}
      outputs: {{ p_click: p_click }}
      keep_inputs: true
      batch: {{ max_size: 1000, max_delay_ms: 2 }}
{model_block}
sink:
  jsonl: {{ path: "{out}" }}
runtime: {{ workers: 2 }}
"#,
        ratings = ratings().display(),
        control = model("ml100k_ncf_ctr.onnx").display(),
        out = out.display(),
    )
}

/// (user, item) → (p_click, variant) of a results file.
fn results(path: &Path) -> BTreeMap<(i64, i64), (f64, String)> {
    read_jsonl(path)
        .into_iter()
        .map(|r| {
            let key = (
                r["user_id"].as_i64().unwrap(),
                r["item_id"].as_i64().unwrap(),
            );
            let variant = r["variant"].as_str().unwrap_or("").to_string();
            (key, (r["p_click"].as_f64().unwrap(), variant))
        })
        .collect()
}

#[test]
fn variants_are_sticky_per_key_by_weight_and_the_shadow_stays_off_the_main_output() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let halved = scaled_model(tmp.path(), 0.5);
    let tripled = scaled_model(tmp.path(), 3.0);

    let plain_out = tmp.path().join("plain.jsonl");
    let plain = write(tmp.path(), "plain.yaml", &pipeline(&plain_out, ""));
    riffle_ok(&["run", "-q", plain.to_str().unwrap()]);
    let plain = results(&plain_out);

    let out = tmp.path().join("ab.jsonl");
    let shadow_out = tmp.path().join("shadow.jsonl");
    let block = format!(
        "      variants: [{{ name: half, path: \"{}\", weight: 0.3 }}]\n      variant_key: user_id\n      shadow: {{ path: \"{}\", sample: 0.2, output: \"{}\" }}",
        halved.display(),
        tripled.display(),
        shadow_out.display()
    );
    let ab = write(tmp.path(), "ab.yaml", &pipeline(&out, &block));
    let plan = riffle_ok(&["validate", ab.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&plan.stdout).contains("variant"));
    let run = riffle_ok(&["run", ab.to_str().unwrap()]);
    let summary =
        String::from_utf8_lossy(&run.stdout).into_owned() + &String::from_utf8_lossy(&run.stderr);
    let ab = results(&out);

    // Every click answered once, each by its variant's model.
    assert_eq!(ab.len(), plain.len());
    let mut variant_of_user: BTreeMap<i64, String> = BTreeMap::new();
    for (key, (p, variant)) in &ab {
        let (expected, _) = &plain[key];
        let factor = match variant.as_str() {
            "control" => 1.0,
            "half" => 0.5,
            other => panic!("unknown variant {other}"),
        };
        assert!(
            (p - expected * factor).abs() < 1e-6,
            "{key:?}: {p} vs {expected} × {factor}"
        );
        // Sticky: one variant per user, whichever worker and batch the clicks came in.
        let first = variant_of_user
            .entry(key.0)
            .or_insert_with(|| variant.clone());
        assert_eq!(first, variant, "user {} moved between variants", key.0);
    }
    let users = variant_of_user.len() as f64;
    let half = variant_of_user.values().filter(|v| *v == "half").count() as f64;
    assert!(
        (half / users - 0.3).abs() < 0.08,
        "{half} of {users} users on the 0.3 variant"
    );

    // The shadow: about a fifth of the users, its own (tripled) outputs, none in the main file.
    let shadow = read_jsonl(&shadow_out);
    assert!(!shadow.is_empty());
    let shadow_users: BTreeSet<i64> = shadow
        .iter()
        .map(|r| r["user_id"].as_i64().unwrap())
        .collect();
    let share = shadow_users.len() as f64 / users;
    assert!(
        (share - 0.2).abs() < 0.08,
        "shadow saw {share} of the users"
    );
    for r in &shadow {
        let key = (
            r["user_id"].as_i64().unwrap(),
            r["item_id"].as_i64().unwrap(),
        );
        let p = r["p_click"].as_f64().unwrap();
        assert!(
            (p - plain[&key].0 * 3.0).abs() < 1e-5,
            "{key:?}: shadow {p}"
        );
    }
    // Per-variant metrics: each served model is a stage of its own in the summary.
    for stage in ["model[control]", "model[half]", "model[shadow]"] {
        assert!(
            summary.contains(stage),
            "{stage} missing from the summary:\n{summary}"
        );
    }
}

#[test]
fn a_variant_that_cannot_stand_in_is_a_validation_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("ab.jsonl");
    let block = format!(
        "      variants: [{{ name: other, path: \"{}\", weight: 0.5 }}]\n      variant_key: user_id",
        model("mobilenet_v2_imagenet.onnx").display()
    );
    let p = write(tmp.path(), "bad.yaml", &pipeline(&out, &block));
    let result = riffle(&["validate", p.to_str().unwrap()]);
    assert!(!result.status.success());
    let err = String::from_utf8_lossy(&result.stderr);
    assert!(
        err.contains("variants[0].path") && err.contains("cannot stand in"),
        "{err}"
    );

    let block = format!(
        "      variants: [{{ name: half, path: \"{}\", weight: 0.5 }}]",
        model("ml100k_ncf_ctr.onnx").display()
    );
    let p = write(tmp.path(), "nokey.yaml", &pipeline(&out, &block));
    let err =
        String::from_utf8_lossy(&riffle(&["validate", p.to_str().unwrap()]).stderr).into_owned();
    assert!(err.contains("variant_key"), "{err}");
}
