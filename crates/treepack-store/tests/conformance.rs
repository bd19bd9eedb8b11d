//! One conformance suite for the backends: the same checks of what the engine relies on — whole
//! gets (with a size limit), byte ranges, suffixes, sizes, existence (of an empty object too),
//! listings, puts (several parts, overwrite, create-only), deletes and compare-and-swap — run
//! against local disk, memory, and the object stores the engine's remote tests start on
//! 127.0.0.1 (S3 on moto, Azure on azurite, GCS on fake-gcs-server, HTTP on a static server;
//! `scripts/servers.sh` installs them). A store no local stand-in can write (GCS: docs/remote.md)
//! or that is read-only by nature (HTTP) gets the read checks, over objects seeded from outside.

#[path = "../../treepack/tests/support/servers.rs"]
mod servers;

use bytes::Bytes;
use std::future::Future;
use treepack_store::{Layout, Location, ReadMode, StorageOptions};

/// The objects the read checks expect, written by the backend or seeded for it.
const OBJECTS: [(&str, &[u8]); 4] = [("a/x", b"hello world"), ("a/b/y", b"0123456789"), ("top", b"t"), ("empty", b"")];

fn run<F: Future>(f: F) -> F::Output {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap())
        .block_on(f)
}

fn options(pairs: &[(&str, &str)]) -> StorageOptions {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn kind<T: std::fmt::Debug>(r: treepack_store::Result<T>) -> &'static str {
    r.map(|v| panic!("expected an error, got {v:?}")).unwrap_or_else(|e| e.kind())
}

fn put(loc: &Location, rel: &str, data: &[u8]) {
    run(loc.put(rel, vec![Bytes::copy_from_slice(data)], false)).unwrap();
}

/// What every backend must answer the same way about objects that are there (`OBJECTS`).
fn read_checks(loc: &Location, lists: bool) {
    let name = loc.display().to_string();
    let before = loc.stats().read_requests();
    let got = |rel: &str| run(loc.get_opt(rel, 1 << 20)).unwrap().map(|b| b.to_vec());
    assert_eq!(got("a/x").as_deref(), Some(&b"hello world"[..]), "{name}");
    assert_eq!(got("empty").as_deref(), Some(&b""[..]), "{name}: an empty object is read as empty");
    assert_eq!(got("missing"), None, "{name}");
    assert_eq!(kind(run(loc.get_opt("a/x", 4))), "limit_exceeded", "{name}");
    let (b, _version) = run(loc.get_versioned("a/b/y", 1 << 20)).unwrap().unwrap();
    assert_eq!(b.as_ref(), b"0123456789", "{name}");
    // Ranges come back in the order asked, whatever the requests were.
    let r = run(loc.read_ranges("a/x", vec![6..11, 0..5, 2..3], ReadMode::Buffered)).unwrap();
    assert_eq!(r.iter().map(|b| b.as_ref()).collect::<Vec<_>>(), [&b"world"[..], b"hello", b"l"], "{name}");
    let r = run(loc.read_ranges("a/b/y", vec![0..10, 3..7], ReadMode::CachedOrDirect)).unwrap();
    assert_eq!((r[0].as_ref(), r[1].as_ref()), (&b"0123456789"[..], &b"3456"[..]), "{name}");
    assert!(run(loc.read_ranges("a/x", vec![], ReadMode::Buffered)).unwrap().is_empty(), "{name}");
    assert_eq!(run(loc.read_range("a/b/y", 3..7)).unwrap().as_ref(), b"3456", "{name}");
    assert_eq!(kind(run(loc.read_range("missing", 0..1))), "not_found", "{name}");
    // Suffixes: the last bytes with the size; all of a smaller object.
    let (tail, size) = run(loc.read_suffix("a/x", 5)).unwrap();
    assert_eq!((tail.as_ref(), size), (&b"world"[..], 11), "{name}");
    let (tail, size) = run(loc.read_suffix("a/x", 100)).unwrap();
    assert_eq!((tail.as_ref(), size), (&b"hello world"[..], 11), "{name}");
    // Sizes and existence; an empty object exists and has size 0.
    assert_eq!(run(loc.size("a/x")).unwrap(), 11, "{name}");
    assert_eq!(run(loc.size("empty")).unwrap(), 0, "{name}");
    assert_eq!(kind(run(loc.size("missing"))), "not_found", "{name}");
    for (rel, there) in [("a/x", true), ("a/b/y", true), ("empty", true), ("top", true), ("missing", false)] {
        assert_eq!(run(loc.exists(rel)).unwrap(), there, "{name}: exists({rel})");
    }
    if lists {
        let listed: Vec<(String, u64)> = run(loc.list("a")).unwrap().into_iter().map(|(p, n, _)| (p, n)).collect();
        assert_eq!(listed, [("a/x".to_string(), 11)], "{name}: the folder's own objects, not its subfolders'");
        let listed: Vec<(String, u64)> = run(loc.list("a/b")).unwrap().into_iter().map(|(p, n, _)| (p, n)).collect();
        assert_eq!(listed, [("a/b/y".to_string(), 10)], "{name}");
        let all: Vec<String> = run(loc.list("")).unwrap().into_iter().map(|l| l.0).collect();
        assert_eq!(all, ["empty", "top"], "{name}: sorted");
        let x: Vec<String> = run(loc.list_where("a", |n| n == "x")).unwrap().into_iter().map(|l| l.0).collect();
        assert_eq!(x, ["a/x"], "{name}");
        assert!(run(loc.list("nothing")).unwrap().is_empty(), "{name}: a folder that is not there lists empty");
        let mut top = run(loc.top_entries(100)).unwrap();
        top.sort();
        assert_eq!(top, ["a", "empty", "top"], "{name}: the names directly inside");
        assert_eq!(run(loc.top_entries(1)).unwrap().len(), 1, "{name}");
    }
    assert!(loc.stats().read_requests() > before, "{name}: reads are counted");
}

/// What every writable backend must do, then the read checks over what it wrote.
fn write_checks(loc: &Location) {
    let name = loc.display().to_string();
    let before = loc.stats().write_requests();
    for (rel, data) in OBJECTS {
        // Written in parts: the object is their concatenation.
        let (a, b) = data.split_at(data.len() / 2);
        run(loc.put_tracked(rel, vec![Bytes::copy_from_slice(a), Bytes::copy_from_slice(b)], true, false, None))
            .unwrap();
    }
    assert_eq!(loc.stats().write_requests() - before, OBJECTS.len() as u64, "{name}: writes are counted");
    read_checks(loc, true);
    // Create-only refuses an object that exists (the old bytes stay); an overwrite replaces it.
    let e = run(loc.put("a/x", vec![Bytes::from_static(b"other")], true)).unwrap_err();
    assert_eq!(e.kind(), "already_exists", "{name}: {e}");
    assert_eq!(run(loc.get_opt("a/x", 100)).unwrap().unwrap().as_ref(), b"hello world", "{name}");
    put(loc, "a/x", b"replaced");
    assert_eq!(run(loc.get_opt("a/x", 100)).unwrap().unwrap().as_ref(), b"replaced", "{name}");
    // Deletes: gone after, and a missing object is no error.
    run(loc.delete("a/x")).unwrap();
    assert!(!run(loc.exists("a/x")).unwrap(), "{name}");
    run(loc.delete("a/x")).unwrap();
    run(loc.delete("never")).unwrap();
    // Compare-and-swap: a stale version never replaces a newer one.
    let cas = |b: &'static [u8]| vec![Bytes::from_static(b)];
    assert!(run(loc.replace_if_unchanged("cas/x", cas(b"one"), None, false)).unwrap(), "{name}");
    assert!(!run(loc.replace_if_unchanged("cas/x", cas(b"two"), None, false)).unwrap(), "{name}: exists already");
    let (_, v1) = run(loc.get_versioned("cas/x", 100)).unwrap().unwrap();
    assert!(run(loc.replace_if_unchanged("cas/x", cas(b"two"), Some(&v1), false)).unwrap(), "{name}");
    assert!(!run(loc.replace_if_unchanged("cas/x", cas(b"three"), Some(&v1), false)).unwrap(), "{name}: stale");
    assert_eq!(run(loc.get_opt("cas/x", 100)).unwrap().unwrap().as_ref(), b"two", "{name}");
}

/// A single-file location: the object is the location itself (`.`).
fn single_file_checks(loc: &Location) {
    let name = loc.display().to_string();
    assert_eq!(loc.layout(), Layout::SingleFile, "{name}");
    assert!(!run(loc.exists(".")).unwrap(), "{name}");
    assert_eq!(kind(run(loc.read_suffix(".", 4))), "not_found", "{name}");
    run(loc.put(".", vec![Bytes::from_static(b"head"), Bytes::from_static(b"-body-tail")], true)).unwrap();
    assert!(run(loc.exists(".")).unwrap() && run(loc.exists("")).unwrap(), "{name}");
    assert_eq!(run(loc.size(".")).unwrap(), 14, "{name}");
    let (tail, size) = run(loc.read_suffix(".", 4)).unwrap();
    assert_eq!((tail.as_ref(), size), (&b"tail"[..], 14), "{name}");
    assert_eq!(run(loc.read_range(".", 5..9)).unwrap().as_ref(), b"body", "{name}");
    let e = run(loc.put(".", vec![Bytes::from_static(b"x")], true)).unwrap_err();
    assert_eq!(e.kind(), "already_exists", "{name}: {e}");
    assert!(run(loc.top_entries(10)).unwrap().is_empty(), "{name}: a single file has no folder entries");
}

fn every_check(dir: impl Fn(&str) -> Location, file: impl Fn(&str) -> Location) {
    write_checks(&dir("conf"));
    single_file_checks(&file("one.tpk"));
}

#[test]
fn local_disk() {
    let d = tempfile::tempdir().unwrap();
    let at = |p: &str| Location::parse(d.path().join(p).to_str().unwrap()).unwrap();
    every_check(at, at);
    // The local view is there, and only here.
    let l = at("conf");
    assert_eq!(l.local_path(), Some(d.path().join("conf").as_path()));
    assert!(!l.is_remote() && l.remote_tuning().is_none());
}

#[test]
fn memory() {
    let at = |p: &str| Location::parse(&format!("memory://conformance/{p}")).unwrap();
    every_check(at, at);
    let l = at("conf");
    assert!(l.local().is_none() && !l.is_remote());
    // The same bucket by name; a fresh store of its own is reached by no name.
    assert!(run(at("conf").exists("a/b/y")).unwrap());
    write_checks(&Location::new_memory("memory://(fresh)"));
    assert!(Location::forget_memory("conformance"));
    assert!(!run(Location::parse("memory://conformance/conf").unwrap().exists("a/b/y")).unwrap(), "forgotten");
}

/// The local-only capabilities answer "not here" elsewhere, without an error.
#[test]
fn the_local_view_is_absent_elsewhere() {
    let l = Location::parse("memory://no-local/t").unwrap();
    put(&l, "f", b"bytes");
    assert!(!l.read_local_into("f", 0, &mut [0u8; 2]).unwrap());
    assert!(l.mmap("f").unwrap().is_none());
    assert_eq!(l.local_size("f").unwrap(), None);
    assert!(l.save_marker(false).unwrap().is_none());
    assert_eq!(l.running_saves().unwrap(), (None, vec![]));
    assert!(!l.remove_local("f").unwrap());
    run(l.sync_dir("")).unwrap();
    l.will_need("f", &[0..1, 2..4]);
    assert_eq!(l.pin().unwrap().local_path(), None);
}

#[test]
fn s3_on_moto() {
    let moto = servers::moto("bucket");
    let ep = moto.url();
    let at = |p: &str| {
        let o = options(&[
            ("endpoint", &ep),
            ("region", "us-east-1"),
            ("access_key_id", "testing"),
            ("secret_access_key", "testing"),
            ("retry_timeout_secs", "30"),
        ]);
        Location::parse_with(&format!("s3://bucket/{p}"), &o).unwrap()
    };
    every_check(at, at);
    assert!(at("conf").is_remote() && at("conf").local().is_none());
}

#[test]
fn azure_on_azurite() {
    let az = servers::azurite("container");
    // object_store reads the emulator's address from this variable (one azurite per binary).
    std::env::set_var("AZURITE_BLOB_STORAGE_URL", az.url());
    let at = |p: &str| {
        let o = options(&[("use_emulator", "true"), ("retry_timeout_secs", "30")]);
        Location::parse_with(&format!("az://container/{p}"), &o).unwrap()
    };
    every_check(at, at);
}

/// GCS: reads through the XML API of fake-gcs-server, over objects uploaded through its JSON
/// API (no local stand-in completes object_store's writes; docs/remote.md).
#[test]
fn gcs_reads_on_fake_gcs_server() {
    let g = servers::fake_gcs("bucket");
    for (rel, data) in OBJECTS {
        servers::gcs_upload(g.port, "bucket", &format!("conf/{rel}"), data);
    }
    let key = format!(
        r#"{{"gcs_base_url": "{}", "disable_oauth": true, "client_email": "", "private_key": "", "private_key_id": ""}}"#,
        g.url()
    );
    let o = options(&[("google_service_account_key", &key), ("allow_http", "true"), ("retry_timeout_secs", "10")]);
    read_checks(&Location::parse_with("gs://bucket/conf", &o).unwrap(), true);
}

/// HTTP(S): read-only by nature; its writes are refused before any request.
#[test]
fn http_reads_on_a_static_server() {
    let d = tempfile::tempdir().unwrap();
    for (rel, data) in OBJECTS {
        let p = d.path().join("conf").join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
    let web = servers::StaticServer::start(d.path().to_path_buf());
    let loc = Location::parse(&format!("{}/conf", web.url())).unwrap();
    // A static server has no listings (object_store lists HTTP stores with WebDAV's PROPFIND).
    read_checks(&loc, false);
    let e = run(loc.put("new", vec![Bytes::from_static(b"x")], false)).unwrap_err();
    assert_eq!(e.kind(), "read_only", "{e}");
    assert_eq!(kind(run(loc.delete("a/x"))), "read_only");
}
