use super::*;
use arrow_array::{StringArray, UInt64Array};
use riffle_dataflow::tensor::{tensor_column, tensor_field};

fn batch(groups: Vec<i64>, items: Vec<Option<i64>>, scores: Vec<f32>) -> RecordBatch {
    let names: Vec<String> = groups.iter().map(|g| format!("user-{g}")).collect();
    RecordBatch::try_from_iter(vec![
        ("event", Arc::new(Int64Array::from(groups)) as ArrayRef),
        ("user", Arc::new(StringArray::from(names)) as _),
        ("candidate", Arc::new(Int64Array::from(items)) as _),
        ("p_click", Arc::new(Float32Array::from(scores)) as _),
    ])
    .unwrap()
}

fn stage(k: usize) -> Rank {
    Rank::new(RankConfig {
        k,
        ..RankConfig::default()
    })
    .unwrap()
}

/// Each output row's (items, scores); a null score is `None`.
fn lists(out: &RecordBatch) -> Vec<(Vec<i64>, Vec<Option<f32>>)> {
    let recs = out.column_by_name("recs").unwrap().as_list::<i32>();
    let scores = out.column_by_name("recs_score").unwrap().as_list::<i32>();
    (0..out.num_rows())
        .map(|r| {
            let items = recs.value(r).as_primitive::<Int64Type>().values().to_vec();
            let s = scores.value(r);
            let s = s.as_primitive::<Float32Type>().iter().collect();
            (items, s)
        })
        .collect()
}

/// The plain computation the stage must agree with: split into runs, drop null items,
/// sort each run fully, keep k.
fn reference(
    groups: &[i64],
    items: &[Option<i64>],
    scores: &[f32],
    k: usize,
) -> Vec<(i64, Vec<i64>, Vec<Option<f32>>)> {
    let mut out: Vec<(i64, Vec<(f32, i64)>)> = Vec::new();
    for ((&g, item), &s) in groups.iter().zip(items).zip(scores) {
        if out.last().is_none_or(|(last, _)| *last != g) {
            out.push((g, Vec::new()));
        }
        if let (Some(item), Some((_, group))) = (item, out.last_mut()) {
            group.push((s, *item));
        }
    }
    out.into_iter()
        .map(|(g, mut c)| {
            // Stable sort on (NaN last, score descending, item ascending).
            c.sort_by(|a, b| {
                (a.0.is_nan().cmp(&b.0.is_nan()))
                    .then(b.0.total_cmp(&a.0))
                    .then(a.1.cmp(&b.1))
            });
            c.truncate(k);
            (
                g,
                c.iter().map(|p| p.1).collect(),
                c.iter().map(|p| Some(p.0)).collect(),
            )
        })
        .collect()
}

#[test]
fn groups_of_different_sizes_ties_and_empty_requests() {
    let batch = batch(
        vec![1, 1, 1, 1, 2, 3, 3, 3, 1],
        vec![
            Some(14),
            Some(11),
            Some(13),
            Some(12),
            None,
            Some(31),
            None,
            Some(30),
            Some(40),
        ],
        vec![0.1, 0.5, 0.5, 0.9, 0.0, 0.3, 0.99, 0.3, 0.7],
    );
    let mut rank = stage(3);
    let expected = rank.output_schema(batch.schema_ref()).unwrap();
    let out = rank.process_batch(&batch).unwrap().records;
    assert_eq!(out.schema(), expected);
    assert!(!rank.preserves_rows());

    let names: Vec<&str> = expected
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect();
    assert_eq!(names, vec!["event", "user", "recs", "recs_score"]);
    let events = out.column(0).as_primitive::<Int64Type>();
    // Event 1 comes back after event 3: a new group, in input order.
    assert_eq!(events.values().as_ref(), &[1, 2, 3, 1]);
    assert_eq!(out.column(1).as_string::<i32>().value(2), "user-3");

    assert_eq!(
        lists(&out),
        vec![
            // Top 3 of 4; 11 and 13 tie at 0.5, the smaller item first.
            (vec![12, 11, 13], vec![Some(0.9), Some(0.5), Some(0.5)]),
            // A request with no candidates: empty, not null.
            (vec![], vec![]),
            // The null item's 0.99 is ignored; k larger than the group.
            (vec![30, 31], vec![Some(0.3), Some(0.3)]),
            (vec![40], vec![Some(0.7)]),
        ]
    );
    let recs = out.column_by_name("recs").unwrap();
    assert_eq!(recs.null_count(), 0);
}

#[test]
fn nan_and_null_scores_rank_last() {
    let scores = Float32Array::from(vec![Some(f32::NAN), None, Some(0.2), Some(-1.0)]);
    let input = RecordBatch::try_from_iter(vec![
        (
            "event",
            Arc::new(UInt64Array::from(vec![5u64; 4])) as ArrayRef,
        ),
        (
            "candidate",
            Arc::new(Int64Array::from(vec![1, 2, 3, 4])) as _,
        ),
        ("p_click", Arc::new(scores) as _),
    ])
    .unwrap();
    let out = stage(10).process_batch(&input).unwrap().records;
    let got = lists(&out);
    assert_eq!(got[0].0, vec![3, 4, 1, 2]);
    assert_eq!(got[0].1[..2], [Some(0.2), Some(-1.0)]);
    assert!(got[0].1[2].is_some_and(f32::is_nan));
    assert_eq!(got[0].1[3], None);
}

#[test]
fn reads_model_output_of_shape_n_by_1() {
    let field = tensor_field("p_click", DataType::Float32, &[1]);
    let scores = tensor_column::<Float32Type>(&field, vec![0.1, 0.8, 0.4, 0.6]).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("event", DataType::Int64, false),
        Field::new("candidate", DataType::Int64, true),
        field,
    ]));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![1, 1, 2, 2])),
        Arc::new(Int64Array::from(vec![10, 11, 20, 21])),
        scores,
    ];
    let input = RecordBatch::try_new(schema, columns).unwrap();
    let mut rank = stage(1);
    // A slice exercises the offset of the list's child buffer.
    let out = rank.process_batch(&input.slice(1, 3)).unwrap().records;
    assert_eq!(
        lists(&out),
        vec![(vec![11], vec![Some(0.8)]), (vec![21], vec![Some(0.6)])]
    );
    let score_list = out.schema().field_with_name("recs_score").unwrap().clone();
    assert_eq!(
        score_list.data_type(),
        &DataType::List(Arc::new(Field::new_list_field(DataType::Float32, false)))
    );
}

#[test]
fn matches_reference_on_random_groups() {
    // xorshift: deterministic data without a dependency.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for k in [1, 3, 10] {
        let (mut groups, mut items, mut scores) = (Vec::new(), Vec::new(), Vec::new());
        let mut event = 0;
        while groups.len() < 2_000 {
            event += 1 + (next() % 3) as i64;
            for _ in 0..next() % 25 + 1 {
                groups.push(event);
                // Few distinct items and scores, so ties and duplicates are common.
                items.push((next() % 10 != 0).then(|| (next() % 40) as i64));
                scores.push(match next() % 50 {
                    0 => f32::NAN,
                    s => (s % 8) as f32 / 8.0,
                });
            }
        }
        let input = batch(groups.clone(), items.clone(), scores.clone());
        let out = stage(k).process_batch(&input).unwrap().records;
        let events = out.column(0).as_primitive::<Int64Type>().values().to_vec();
        let got: Vec<(i64, Vec<i64>, Vec<Option<f32>>)> = events
            .into_iter()
            .zip(lists(&out))
            .map(|(e, (i, s))| (e, i, s))
            .collect();
        let want = reference(&groups, &items, &scores, k);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert_eq!((g.0, &g.1), (w.0, &w.1), "k={k}");
            let bits = |s: &Vec<Option<f32>>| -> Vec<Option<u32>> {
                s.iter().map(|v| v.map(f32::to_bits)).collect()
            };
            assert_eq!(bits(&g.2), bits(&w.2), "k={k} event {}", g.0);
        }
    }
}

#[test]
fn empty_batch_gives_empty_output() {
    let input = batch(vec![], vec![], vec![]);
    let out = stage(5).process_batch(&input).unwrap().records;
    assert_eq!(out.num_rows(), 0);
    assert_eq!(out.num_columns(), 4);
}

#[test]
fn schema_and_config_errors() {
    assert!(matches!(
        Rank::new(RankConfig {
            k: 0,
            ..RankConfig::default()
        })
        .map_err(crate::unlocated),
        Err(DataflowError::Config(_))
    ));
    assert!(Rank::new(RankConfig {
        group: "candidate".into(),
        ..RankConfig::default()
    })
    .is_err());

    let rank = stage(5);
    let schema = |group: DataType, item: DataType, score: DataType| {
        Arc::new(Schema::new(vec![
            Field::new("event", group, false),
            Field::new("candidate", item, true),
            Field::new("p_click", score, false),
        ]))
    };
    // A schema error on `column`, located at the config `key` naming it.
    let expect_error = |input: SchemaRef, key: &str, column: &str, found: &str| {
        let e = rank.output_schema(&input).map(|_| ());
        assert_eq!(
            e.as_ref().err().and_then(|e| e.located().0),
            Some(key),
            "{e:?}"
        );
        match e.map_err(crate::unlocated) {
            Err(DataflowError::Schema {
                column: c,
                found: f,
                ..
            }) => {
                assert_eq!(c, column);
                assert!(f.contains(found), "{f}");
            }
            other => panic!("expected a schema error on `{column}`, got {other:?}"),
        }
    };
    use DataType::{Float32, Float64, Int32, Int64, Utf8};
    expect_error(schema(Utf8, Int64, Float32), "group", "event", "Utf8");
    expect_error(schema(Int64, Int32, Float32), "item", "candidate", "Int32");
    expect_error(schema(Int64, Int64, Float64), "score", "p_click", "Float64");
    let wide = tensor_field("p_click", Float32, &[2]);
    expect_error(
        schema(Int64, Int64, wide.data_type().clone()),
        "score",
        "p_click",
        "2 x",
    );
    let absent = Arc::new(Schema::new(vec![Field::new("event", Int64, false)]));
    expect_error(absent, "item", "candidate", "input has: event");

    let clash = Arc::new(Schema::new(vec![
        Field::new("event", Int64, false),
        Field::new("candidate", Int64, true),
        Field::new("p_click", Float32, false),
        Field::new("recs_score", Float32, false),
    ]));
    expect_error(clash, "output", "recs_score", "existing column");

    // Null group keys fail the batch rather than forming a group of their own.
    let input = RecordBatch::try_from_iter(vec![
        (
            "event",
            Arc::new(Int64Array::from(vec![Some(1), None])) as ArrayRef,
        ),
        ("candidate", Arc::new(Int64Array::from(vec![1, 2])) as _),
        ("p_click", Arc::new(Float32Array::from(vec![0.1, 0.2])) as _),
    ])
    .unwrap();
    assert!(matches!(
        stage(5).process_batch(&input),
        Err(DataflowError::Stage { .. })
    ));
}
