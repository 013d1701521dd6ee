use super::writer::{Done, Writer};
use super::*;
use riffle_storage::StoreOptions;

fn checkpoint(epoch: Epoch, offset: i64) -> Checkpoint {
    Checkpoint {
        epoch,
        workers: 2,
        sources: BTreeMap::from([(
            "log:t".to_string(),
            BTreeMap::from([(0, offset), (1, offset + 1)]),
        )]),
        state: BTreeMap::new(),
    }
}

/// A fresh object-store prefix (in this process's memory) and its store.
fn object_store(name: &str, keep: usize) -> (Location, CheckpointStore) {
    let at = Location::parse(
        &format!("memory://ckpt-{name}/run"),
        &StoreOptions::default(),
    )
    .unwrap();
    (at.clone(), CheckpointStore::on(at, keep))
}

#[test]
fn newest_intact_checkpoint_wins_and_old_ones_are_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path(), 3).unwrap();
    assert_eq!(store.latest().unwrap(), None);
    for e in 1..=5 {
        store.write(&checkpoint(e, e as i64 * 10)).unwrap();
    }
    assert_eq!(store.latest().unwrap(), Some(checkpoint(5, 50)));
    assert_eq!(store.epochs().unwrap(), vec![3, 4, 5], "pruned to 3");
    assert!(!dir.path().join("epoch-000000000005.ckpt.tmp").exists());
}

#[test]
fn a_given_epoch_is_found_and_newer_ones_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path(), 3).unwrap();
    for e in 1..=3 {
        store.write(&checkpoint(e, e as i64 * 10)).unwrap();
    }
    assert_eq!(store.at(2).unwrap(), Some(checkpoint(2, 20)));
    assert_eq!(store.at(7).unwrap(), None);
    assert_eq!(store.discard_after(Some(1)).unwrap(), 2);
    assert_eq!(store.latest().unwrap(), Some(checkpoint(1, 10)));
    assert_eq!(store.discard_after(None).unwrap(), 1);
    assert_eq!(store.latest().unwrap(), None);
}

#[test]
fn corrupt_or_partial_newest_checkpoint_falls_back_to_the_previous() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path(), 5).unwrap();
    store.write(&checkpoint(1, 10)).unwrap();
    let newest = store.write(&checkpoint(2, 20)).unwrap();
    // A flipped digit in the body: the checksum catches it.
    let text = fs::read_to_string(&newest).unwrap().replace("20", "21");
    fs::write(&newest, text).unwrap();
    assert_eq!(store.latest().unwrap(), Some(checkpoint(1, 10)));
    // A torn write: no trailer.
    let text = fs::read_to_string(&newest).unwrap();
    fs::write(&newest, &text[..text.len() / 2]).unwrap();
    assert_eq!(store.latest().unwrap(), Some(checkpoint(1, 10)));
    // An empty file.
    fs::write(&newest, "").unwrap();
    assert_eq!(store.latest().unwrap(), Some(checkpoint(1, 10)));
}

#[test]
fn a_directory_checkpoint_keeps_its_bytes() {
    // The format other tools and older runs read: JSON, then the CRC-32 trailer line.
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path(), 3).unwrap();
    let path = store.write(&checkpoint(7, 70)).unwrap();
    assert_eq!(
        path,
        dir.path()
            .join("epoch-000000000007.ckpt")
            .display()
            .to_string()
    );
    let body = r#"{"epoch":7,"workers":2,"sources":{"log:t":{"0":70,"1":71}},"state":{}}"#;
    let expected = format!("{body}\n#crc32:{:08x}\n", crc32fast::hash(body.as_bytes()));
    assert_eq!(fs::read_to_string(&path).unwrap(), expected);
}

#[test]
fn object_checkpoints_are_the_same_bytes_pruned_and_discarded() {
    let (at, store) = object_store("basics", 3);
    assert_eq!(store.describe(), "memory://ckpt-basics/run");
    assert_eq!(store.latest().unwrap(), None);
    for e in 1..=5 {
        let url = store.write(&checkpoint(e, e as i64 * 10)).unwrap();
        assert_eq!(url, format!("memory://ckpt-basics/run/epoch-{e:012}.ckpt"));
    }
    assert_eq!(store.epochs().unwrap(), vec![3, 4, 5], "pruned to 3");
    assert_eq!(store.latest().unwrap(), Some(checkpoint(5, 50)));
    assert_eq!(store.at(4).unwrap(), Some(checkpoint(4, 40)));
    let object = at.get("epoch-000000000005.ckpt").unwrap().unwrap();
    assert_eq!(
        String::from_utf8(object.to_vec()).unwrap(),
        encode(&checkpoint(5, 50)).unwrap()
    );
    assert_eq!(store.discard_after(Some(3)).unwrap(), 2);
    assert_eq!(store.latest().unwrap(), Some(checkpoint(3, 30)));
}

#[test]
fn an_object_checkpoint_is_never_overwritten_but_rewriting_the_same_is_fine() {
    let (_, store) = object_store("never-overwritten", 3);
    store.write(&checkpoint(1, 10)).unwrap();
    // A try whose answer was lost, written again: the same bytes are there.
    store.write(&checkpoint(1, 10)).unwrap();
    let e = store.write(&checkpoint(1, 11)).unwrap_err().to_string();
    assert!(
        e.contains(
            "memory://ckpt-never-overwritten/run/epoch-000000000001.ckpt exists with other content"
        ),
        "{e}"
    );
    assert_eq!(store.latest().unwrap(), Some(checkpoint(1, 10)));
}

#[test]
fn a_torn_or_corrupt_newest_object_falls_back_to_the_previous() {
    let (at, store) = object_store("torn", 5);
    store.write(&checkpoint(1, 10)).unwrap();
    store.write(&checkpoint(2, 20)).unwrap();
    let name = "epoch-000000000002.ckpt";
    let text = encode(&checkpoint(2, 20)).unwrap();
    at.put(name, text.as_bytes()[..text.len() / 2].to_vec())
        .unwrap();
    assert_eq!(store.latest().unwrap(), Some(checkpoint(1, 10)));
    at.put(name, text.replace("20", "21").into_bytes()).unwrap();
    assert_eq!(store.latest().unwrap(), Some(checkpoint(1, 10)));
    at.put(name, vec![0xff, 0xfe]).unwrap();
    assert_eq!(store.latest().unwrap(), Some(checkpoint(1, 10)));
    assert!(store.at(2).is_err(), "asked for by epoch, it is an error");
}

#[test]
fn a_store_that_fails_is_an_error_not_a_skipped_checkpoint() {
    // Nothing listens on this port: listing fails, and must not read as "no checkpoints".
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let options = StoreOptions {
        endpoint: Some(format!("http://127.0.0.1:{port}")),
        access_key_id: Some("k".into()),
        secret_access_key: Some("s".into()),
        timeout_s: Some(1),
        ..StoreOptions::default()
    };
    let store = CheckpointStore::on(Location::parse("s3://b/p", &options).unwrap(), 3);
    let e = store.latest().unwrap_err().to_string();
    assert!(
        e.starts_with("listing checkpoints: listing s3://b/p/epoch-"),
        "{e}"
    );
    let e = store.write(&checkpoint(1, 1)).unwrap_err().to_string();
    assert!(
        e.starts_with("writing a checkpoint: writing (if absent) s3://b/p/epoch-000000000001.ckpt"),
        "{e}"
    );
}

#[test]
fn the_writer_writes_in_the_background_and_releases_its_lease() {
    let (at, store) = object_store("writer", 3);
    let lease = lease::Lease::acquire(&at, 7, std::time::Duration::from_millis(600)).unwrap();
    let writer = Writer::spawn(store.clone(), Some(lease)).unwrap();
    assert_eq!(writer.url(), "memory://ckpt-writer/run");
    writer.submit(checkpoint(1, 10)).unwrap();
    let started = std::time::Instant::now();
    let done = loop {
        if let Some(done) = writer.try_done() {
            break done;
        }
        assert!(started.elapsed().as_secs() < 10, "no outcome");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    assert!(matches!(done, Done::Written(1, ref url) if url.ends_with("epoch-000000000001.ckpt")));
    assert_eq!(store.latest().unwrap(), Some(checkpoint(1, 10)));
    // Renewed meanwhile: still fresh after more than its timeout.
    std::thread::sleep(std::time::Duration::from_millis(900));
    let e = lease::Lease::acquire(&at, 8, std::time::Duration::from_secs(1)).unwrap_err();
    assert!(e.to_string().contains("(run 7)"), "{e}");
    drop(writer);
    assert!(!at.exists(lease::LEASE).unwrap(), "released at the end");
}

#[test]
fn a_writer_that_lost_its_lease_says_so_and_writes_nothing_more() {
    let (at, store) = object_store("lost", 3);
    let lease = lease::Lease::acquire(&at, 1, std::time::Duration::from_millis(300)).unwrap();
    let writer = Writer::spawn(store.clone(), Some(lease)).unwrap();
    // Another run replaces the lease (as a taker of a stale one would): the next renewal
    // finds out.
    at.put(lease::LEASE, b"{}".to_vec()).unwrap();
    let started = std::time::Instant::now();
    let done = loop {
        if let Some(done) = writer.try_done() {
            break done;
        }
        assert!(started.elapsed().as_secs() < 10, "no outcome");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let Done::LeaseLost(e) = done else {
        panic!("{done:?}")
    };
    assert!(
        e.to_string()
            .contains("memory://ckpt-lost/run/riffle.lease"),
        "{e}"
    );
    assert!(
        writer.submit(checkpoint(1, 10)).is_err(),
        "the writer has stopped"
    );
    assert_eq!(
        store.latest().unwrap(),
        None,
        "nothing written without the lease"
    );
    drop(writer);
    assert_eq!(at.get(lease::LEASE).unwrap().as_deref(), Some(&b"{}"[..]));
}

#[test]
fn each_successful_write_is_timed_across_the_stores_clones() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path(), 3).unwrap();
    assert_eq!(store.write_times(), None);
    let clone = store.clone();
    for e in 1..=4 {
        clone.write(&checkpoint(e, e as i64)).unwrap();
    }
    // A failed write (its directory gone) is not a checkpoint written.
    std::fs::remove_dir_all(dir.path()).unwrap();
    assert!(store.write(&checkpoint(5, 5)).is_err());
    let t = store.write_times().unwrap();
    assert_eq!(t.count, 4);
    assert!(
        t.p50 <= t.p99 && t.p99 <= t.max && t.max > Duration::ZERO,
        "{t:?}"
    );
}
