use super::cpu::{broadcast, gather_split, reduce_sum};
use super::*;

#[test]
fn broadcasting_and_reduction() {
    let a = Tensor::f32(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]);
    let b = Tensor::f32(vec![3], vec![10., 20., 30.]);
    let s = broadcast(&a, &b, |x, y| x + y).unwrap();
    assert_eq!(s.as_f32().unwrap(), &[11., 22., 33., 14., 25., 36.]);
    let r = reduce_sum(&a, &[1], false).unwrap();
    assert_eq!(
        (r.shape.clone(), r.as_f32().unwrap().to_vec()),
        (vec![2], vec![6., 15.])
    );
    let r = reduce_sum(&a, &[0], true).unwrap();
    assert_eq!(
        (r.shape.clone(), r.as_f32().unwrap().to_vec()),
        (vec![1, 3], vec![5., 7., 9.])
    );
    assert!(broadcast(&a, &Tensor::f32(vec![2], vec![1., 2.]), |x, y| x + y).is_err());
}

#[test]
fn row_ranges_cover_the_table_and_route_every_index_to_its_part() {
    let shards = RowShards::split(10, 3);
    assert_eq!(
        (0..3).map(|k| shards.range(k)).collect::<Vec<_>>(),
        vec![0..3, 3..6, 6..10]
    );
    let routes = shards.route(&[9, 0, 3, -1, 5, 2]).unwrap();
    assert_eq!(routes[0].positions, vec![1, 5]);
    assert_eq!(routes[0].local, vec![0, 2]);
    assert_eq!(routes[1].positions, vec![2, 4]);
    assert_eq!(routes[1].local, vec![0, 2]);
    assert_eq!(routes[2].positions, vec![0, 3]);
    assert_eq!(routes[2].local, vec![3, 3]);
    assert!(shards.route(&[10]).is_err());
    assert!(shards.route(&[-11]).is_err());
    // More parts than rows: one row each.
    assert_eq!(RowShards::split(2, 4).parts(), 2);
}

#[test]
fn a_split_gather_equals_the_whole_one() {
    let table = Tensor::f32(vec![7, 2], (0..14).map(|v| v as f32).collect());
    let idx = Tensor::i64(vec![2, 3], vec![6, 0, 3, 3, -2, 1]);
    let rows = RowShards::split(7, 3);
    let parts = (0..3)
        .map(|k| {
            let r = rows.range(k);
            Tensor::f32(
                vec![r.len(), 2],
                table.as_f32().unwrap()[r.start * 2..r.end * 2].to_vec(),
            )
        })
        .collect();
    let split = gather_split(&SplitTable { rows, parts }, &idx).unwrap();
    assert_eq!(split.shape, vec![2, 3, 2]);
    assert_eq!(
        split.as_f32().unwrap(),
        &[12., 13., 0., 1., 6., 7., 6., 7., 10., 11., 2., 3.]
    );
}

/// Concat parts must match outside the axis: the executors copy whole rows of each part into
/// rows of the output, which a part of other dimensions would overrun (on the GPU, past the
/// output's buffer).
#[test]
fn concat_refuses_parts_that_differ_outside_the_axis() {
    let e = shapes::concat(&[&[2, 3, 4], &[2, 1, 5]], 1).unwrap_err();
    assert!(
        e.to_string().contains("differ on an axis other than 1"),
        "{e}"
    );
    assert!(shapes::concat(&[&[2, 3], &[3, 3]], 1).is_err());
    assert!(shapes::concat(&[&[2, 3], &[2, 3, 1]], 1).is_err());
    assert_eq!(
        shapes::concat(&[&[2, 3, 4], &[2, 1, 4]], -2).unwrap(),
        (1, 2, vec![2, 4, 4])
    );
}
