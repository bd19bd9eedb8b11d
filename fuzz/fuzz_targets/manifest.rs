//! The manifest parser and validator. The input is a manifest body; the harness appends the
//! checksum trailer so the fuzzer explores the JSON, not BLAKE3. Odd-length inputs are also tried
//! unsealed, to fuzz the trailer check itself.
#![no_main]
use libfuzzer_sys::fuzz_target;

mod threads;

fuzz_target!(|data: &[u8]| {
    threads::install();
    let _ = treepack_format::manifest::decode(data, "fuzz");
    let sealed = treepack_format::manifest::seal(data);
    // The structure-only read accepts exactly what the one-pass parse accepts, but for a dict
    // key repeated (which its consumer refuses).
    let strict = treepack_format::manifest::build_one_thread(&sealed, "fuzz", &treepack_format::manifest::OwnedTree);
    let outline = treepack_format::manifest::check(&sealed, "fuzz")
        .and_then(|_| treepack_format::manifest::outline::outline(&sealed, "fuzz", &mut |_| true));
    match (&strict, &outline) {
        (Ok(_), Err(e)) => panic!("the outline refused what the one-pass parse accepts: {e}"),
        (Err(e), Ok(_)) => assert!(e.to_string().contains("duplicate key"), "the outline accepted: {e}"),
        _ => {}
    }
    // The streamed parse (a big manifest's in a Python load: the root parsed onto tapes on a
    // helper thread, replayed here) accepts, builds and refuses exactly what the one-thread
    // parse does.
    let streamed =
        treepack_format::manifest::build_streamed_any_size(&sealed, "fuzz", &treepack_format::manifest::OwnedTree);
    match (&strict, streamed) {
        (_, None) => {}
        (Ok(a), Some(Ok(b))) => {
            let whole = |p: &treepack_format::manifest::Parsed<
                treepack_format::model::Tree<treepack_format::manifest::Entry>,
            >| {
                let m = treepack_format::manifest::Manifest {
                    version: p.version,
                    writer: p.writer.clone(),
                    metadata: p.metadata.clone(),
                    packs: p.packs.clone(),
                    root: p.root.clone(),
                };
                treepack_format::manifest::encode(&m, &serde_json::Value::Null)
            };
            assert!(whole(a) == whole(&b), "the streamed parse built another tree");
        }
        (Err(a), Some(Err(b))) => assert_eq!(a.to_string(), b.to_string(), "the streamed parse refused otherwise"),
        (a, Some(b)) => panic!("the streamed parse disagrees: one thread {:?}, streamed {:?}", a.is_ok(), b.is_ok()),
    }
    if let Ok(m) = treepack_format::manifest::decode(&sealed, "fuzz") {
        let _ = m.structure();
        let stats = serde_json::Value::Null;
        let again = treepack_format::manifest::encode(&m, &stats);
        // What we write, we must read back.
        treepack_format::manifest::decode(&again, "re-encoded").expect("a decoded manifest re-encodes to a valid one");
    }
});
