use super::cpu::{broadcast, broadcast_walk, gather_split, matmul, reduce_sum, reduce_walk};
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

/// Values that are not round numbers, so that a changed order of operations would show.
fn wobbly(shape: &[usize], seed: f32) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::f32(
        shape.to_vec(),
        (0..n)
            .map(|i| (i as f32 * 0.37 + seed).sin() * 3.0)
            .collect(),
    )
}

fn bits(t: &Tensor) -> (Vec<usize>, Vec<u32>) {
    let v = t.as_f32().unwrap().iter().map(|x| x.to_bits()).collect();
    (t.shape.clone(), v)
}

#[test]
fn the_one_pass_elementwise_and_row_sums_equal_the_index_walks_bit_for_bit() {
    let cases: &[(&[usize], &[usize])] = &[
        (&[4, 3], &[4, 3]),
        (&[4, 3], &[]),
        (&[4, 3], &[1]),
        (&[4, 3], &[3]),
        (&[4, 3], &[1, 3]),
        (&[3], &[4, 3]),
        (&[], &[4, 3]),
        (&[4, 1], &[4, 3]),
        (&[4, 1], &[1, 3]),
        (&[2, 4, 3], &[4, 3]),
        (&[2, 4, 3], &[4, 1]),
        (&[2, 1, 3], &[2, 4, 3]),
    ];
    let ops: [fn(f32, f32) -> f32; 3] = [|a, b| a + b, |a, b| a - b, |a, b| a / b];
    for (sa, sb) in cases {
        let (a, b) = (wobbly(sa, 0.1), wobbly(sb, 1.7));
        for f in ops {
            let fast = broadcast(&a, &b, f).unwrap();
            let walk = broadcast_walk(&a, &b, f).unwrap();
            assert_eq!(bits(&fast), bits(&walk), "{sa:?} with {sb:?}");
        }
    }
    // A tensor whose data is shorter than its shape is an error on either path.
    let short = Tensor::f32(vec![4, 3], vec![1.0; 11]);
    assert!(broadcast(&short, &wobbly(&[3], 0.0), |a, b| a + b).is_err());
    for (shape, axes) in [
        (&[2usize, 4, 3][..], &[2usize][..]),
        (&[5, 16], &[1]),
        (&[7], &[0]),
        (&[2, 4, 3], &[1]),
    ] {
        let x = wobbly(shape, 0.5);
        for keep in [true, false] {
            let fast = reduce_sum(&x, axes, keep).unwrap();
            let walk = reduce_walk(&x, axes, keep).unwrap();
            assert_eq!(
                bits(&fast),
                bits(&walk),
                "{shape:?} over {axes:?}, keep {keep}"
            );
        }
    }
}

#[test]
fn matrix_products_equal_the_definition_in_every_layout() {
    let (m, k, n) = (5, 7, 3);
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let a = wobbly(&[m * k], 0.3);
        let b = wobbly(&[k * n], 2.1);
        let (av, bv) = (a.as_f32().unwrap(), b.as_f32().unwrap());
        let got = matmul("Gemm", av, bv, (m, k, n), (ta, tb), 0.5).unwrap();
        for i in 0..m {
            for j in 0..n {
                let want: f32 = (0..k)
                    .map(|p| {
                        let x = if ta { av[p * m + i] } else { av[i * k + p] };
                        let y = if tb { bv[j * k + p] } else { bv[p * n + j] };
                        x * y
                    })
                    .sum::<f32>()
                    * 0.5;
                let g = got[i * n + j];
                assert!(
                    (g - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "{ta} {tb} ({i}, {j}): {g} vs {want}"
                );
            }
        }
    }
    // Empty products: an all-zero result of the right size; too little data: an error.
    assert_eq!(
        matmul("MatMul", &[], &[1.0; 8], (0, 4, 2), (false, false), 1.0).unwrap(),
        Vec::<f32>::new()
    );
    assert_eq!(
        matmul("MatMul", &[], &[], (2, 0, 3), (false, false), 1.0).unwrap(),
        vec![0.0; 6]
    );
    assert!(matmul(
        "MatMul",
        &[1.0; 5],
        &[1.0; 6],
        (2, 3, 2),
        (false, false),
        1.0
    )
    .is_err());
}
