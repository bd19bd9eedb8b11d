//! A repository's damaged bookkeeping files fail with errors that name the file and say what to
//! do (issue 50, finding 7): a `gc.json` that is not a gc state stops gc and saves, saying so.

use treepack::*;

fn small() -> Node {
    Node::dict(vec![("x".to_string(), Node::from(ArrayData::new(DType::U8, vec![4], vec![1, 2, 3, 4]).unwrap()))])
}

#[test]
fn a_damaged_gc_state_is_named_and_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let loc = dir.path().join("repo");
    let repo = Repository::create(loc.to_str().unwrap()).unwrap();
    repo.save(&small(), "a", &SaveOptions::default()).unwrap();
    repo.gc(std::time::Duration::from_secs(3600)).unwrap();
    let state = loc.join("gc.json"); // the gc state, at the repository's root (docs/repository.md)
    for bad in [&b"{not json"[..], br#"{"condemned":{"../../etc/passwd":1}}"#, b"[1,2,3]"] {
        std::fs::write(&state, bad).unwrap();
        let gc = repo.gc(std::time::Duration::from_secs(0)).unwrap_err();
        let save = repo.save(&small(), "b", &SaveOptions::default()).unwrap_err();
        for e in [gc, save] {
            assert_eq!(e.kind(), "invalid_repo_file", "{e}");
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("invalid gc state file {}", state.display())), "{msg}");
            assert!(msg.contains("delete the file") && !msg.contains("manifest"), "{msg}");
        }
    }
    // What the message says to do works: without the file, gc and saves run again.
    std::fs::remove_file(&state).unwrap();
    repo.gc(std::time::Duration::from_secs(3600)).unwrap();
    repo.save(&small(), "b", &SaveOptions::default()).unwrap();
}
