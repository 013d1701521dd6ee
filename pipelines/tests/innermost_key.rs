//! A bad number inside a flow mapping (`batch: { max_size: -3 }`) is reported at its own key,
//! with the range it must be in, whatever is wrong with it.

use std::path::Path;

use riffle_pipelines::validate::parse;

const SHIPPED: &str = include_str!("../camera-perception.yaml");
const BATCH: &str = "batch: { max_size: 1, max_delay_ms: 10, late_after_ms: 2000 }";

/// The shipped pipeline with its model's `batch` mapping rewritten, parsed: the error.
fn error_with(batch: &str) -> riffle_pipelines::PipelineError {
    assert!(
        SHIPPED.contains(BATCH),
        "the shipped pipeline's batch line changed"
    );
    let text = SHIPPED.replacen(BATCH, batch, 1);
    let line = text
        .lines()
        .position(|l| l.contains(batch))
        .map(|i| i as u64 + 1);
    match parse(Path::new("p.yaml"), &text) {
        Ok(_) => panic!("`{batch}` parsed"),
        Err(e) => {
            assert_eq!(e.line, line, "{e}");
            e
        }
    }
}

#[test]
fn negative_fractional_and_too_large_numbers_name_the_key_and_its_range() {
    for (value, found) in [("-3", "-3"), ("2.5", "2.5"), ("1e30", "1e30")] {
        let e = error_with(&format!("batch: {{ max_size: {value}, max_delay_ms: 10 }}"));
        assert_eq!(e.field, "stages[2].model.batch.max_size", "{e}");
        assert!(
            e.message
                .starts_with("expected an integer from 1 to 65536, found"),
            "{e}"
        );
        // The number as written (YAML may spell a huge one differently).
        assert!(e.message.contains(found) || value == "1e30", "{value}: {e}");
    }
    // Not the first key of the mapping.
    let e = error_with("batch: { max_size: 4, max_delay_ms: -1 }");
    assert_eq!(e.field, "stages[2].model.batch.max_delay_ms", "{e}");
    assert!(
        e.message
            .starts_with("expected an integer from 0 to 60000, found -1"),
        "{e}"
    );
}

#[test]
fn a_value_of_the_wrong_type_names_the_key_and_its_range() {
    let e = error_with("batch: { max_size: lots, max_delay_ms: 10 }");
    assert_eq!(e.field, "stages[2].model.batch.max_size", "{e}");
    assert!(
        e.message
            .starts_with("expected an integer from 1 to 65536, found lots"),
        "{e}"
    );
    let e = error_with("batch: { max_size: 4, max_delay_ms: [10] }");
    assert_eq!(e.field, "stages[2].model.batch.max_delay_ms", "{e}");
    assert!(
        e.message
            .starts_with("expected an integer from 0 to 60000, found [10]"),
        "{e}"
    );
}

#[test]
fn a_whole_stage_written_as_one_flow_mapping_is_followed_too() {
    let text = "source: { csv: { path: in.csv } }\nstages:\n  - select: { columns: [item_id] }\n  - model: { path: m.onnx, batch: { max_size: -3, max_delay_ms: 5 } }\nsink: { stdout: {} }\n";
    let Err(e) = parse(Path::new("p.yaml"), text) else {
        panic!("max_size: -3 parsed");
    };
    assert_eq!(e.line, Some(4), "{e}");
    assert_eq!(e.field, "stages[1].model.batch.max_size", "{e}");
    assert_eq!(
        e.message, "expected an integer from 1 to 65536, found -3",
        "{e}"
    );
}
