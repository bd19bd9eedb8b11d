//! Free JSON values in files (treepack-format/src/json.rs) and the manifest members that hold them
//! (`metadata`, a custom node's `data`, an array's `as`, `preview` and structured `dtype`, a
//! tagged scalar's `v`). The input is one JSON value: read alone by the bounded reader (it must
//! agree with serde_json wherever the value is within the bound, and refuse exactly the values
//! nested past it), then placed in each member of a sealed manifest, which every reader must
//! refuse or accept alike, and never by recursing as deep as the text nests.
#![no_main]
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeSeed;
use treepack_format::json::{self, BoundedValue, MAX_VALUE_DEPTH};
use treepack_format::manifest::{self, outline::outline, OwnedTree};

mod threads;

/// Where the value goes in a manifest: the text before and after it, and the member's name.
const PLACES: [(&str, &str, &str); 7] = [
    (
        "{\"format\":\"treepack\",\"version\":[1,4],\n\"writer\":\"f\",\n\"metadata\":",
        ",\n\"packs\":[],\n\"root\":1",
        "metadata",
    ),
    (HEAD, "}}", "data"),
    (HEAD, "}}", "as"),
    (HEAD, "}}", "preview"),
    (HEAD, "}}", "dtype"),
    (HEAD, "}}", "v"),
    (HEAD, "}}", "v"),
];
const HEAD: &str = "{\"format\":\"treepack\",\"version\":[1,4],\n\"writer\":\"f\",\n\"packs\":[],\n\"root\":{\"k\":";

/// The node that holds the value (`{}` marks where it goes) for each place after the first.
const NODES: [&str; 7] = [
    "",
    "{\"t\":\"custom\",\"type\":\"x.Y\",\"data\":{}",
    "{\"t\":\"array\",\"dtype\":\"int8\",\"shape\":[1],\"data\":\"AQ==\",\"as\":{}",
    "{\"t\":\"array\",\"dtype\":\"int8\",\"shape\":[1],\"data\":\"AQ==\",\"preview\":{}",
    "{\"t\":\"array\",\"shape\":[0],\"data\":\"\",\"dtype\":{}",
    "{\"t\":\"int\",\"v\":{}",
    "{\"t\":\"complex\",\"v\":{}",
];

/// The smallest bound `v` fits in.
fn depth(v: &serde_json::Value) -> usize {
    let (mut lo, mut hi) = (0, MAX_VALUE_DEPTH);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if json::deeper_than(v, mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

fuzz_target!(|data: &[u8]| {
    threads::install();
    let Ok(text) = std::str::from_utf8(data) else { return };
    // The value alone.
    let bounded = json::from_str(text, "fuzz", MAX_VALUE_DEPTH);
    match &bounded {
        Ok(v) => {
            assert!(!json::deeper_than(v, MAX_VALUE_DEPTH));
            // Within the bound, serde_json's own reader (its recursion unbounded, safe here:
            // the text nests at most MAX_VALUE_DEPTH deep) reads the same value. (serde_json
            // reads a map whose key is its private raw-value token as that raw value.)
            if !text.contains("$serde_json") {
                let mut de = serde_json::Deserializer::from_str(text);
                de.disable_recursion_limit();
                let theirs =
                    <serde_json::Value as serde::Deserialize>::deserialize(&mut de).and_then(|v| de.end().map(|_| v));
                assert_eq!(theirs.as_ref().ok(), Some(v), "serde_json reads {text:?} otherwise");
            }
            // A value fits a bound exactly when it nests no deeper.
            let d = depth(v);
            assert!(json::from_str(text, "fuzz", d).is_ok());
            if d > 0 {
                let e = json::from_str(text, "fuzz", d - 1).expect_err("one level too deep");
                assert!(e.to_string().contains(&json::too_deep("fuzz", d - 1)), "{e}");
            }
        }
        Err(e) if e.to_string().contains("JSON nested deeper than") => {}
        Err(_) => {
            // Not JSON at all: serde_json agrees (its limit on, so it cannot overflow).
            let mut de = serde_json::Deserializer::from_str(text);
            let theirs =
                <serde_json::Value as serde::Deserialize>::deserialize(&mut de).and_then(|v| de.end().map(|_| v));
            assert!(theirs.is_err(), "the bounded reader refused JSON serde_json reads: {text:?}");
        }
    }
    let too_deep = matches!(&bounded, Err(e) if e.to_string().contains("JSON nested deeper than"));
    let _ = BoundedValue::member("fuzz").deserialize(&mut serde_json::Deserializer::from_slice(data));

    // The value in each member of a manifest: the strict parse, the one-pass build and the
    // outline agree; a refusal for depth names the member.
    for (i, (before, after, member)) in PLACES.iter().enumerate() {
        let node = NODES[i].replacen("{}", text, 1);
        let body = if i == 0 { format!("{before}{text}{after}") } else { format!("{before}{node}{after}") };
        let sealed = manifest::seal(body.as_bytes());
        let decoded = manifest::decode(&sealed, "fuzz");
        let built = manifest::build_one_thread(&sealed, "fuzz", &OwnedTree);
        let outlined = outline(&sealed, "fuzz", &mut |_| true);
        assert_eq!(decoded.is_ok(), built.is_ok(), "{member}: decode and build disagree on {text:?}");
        assert_eq!(built.is_ok(), outlined.is_ok(), "{member}: build and outline disagree on {text:?}");
        // Refused for its depth, naming the member, as soon as it is read (a dtype is first
        // told from a dtype name by its first token, and bounded more tightly).
        if too_deep && *member != "dtype" {
            let msg = decoded.as_ref().err().map(ToString::to_string).unwrap_or_default();
            assert!(msg.contains(&json::too_deep(member, MAX_VALUE_DEPTH)), "{member}: {msg}");
        }
        if let Some(Err(e)) = manifest::build_streamed_any_size(&sealed, "fuzz", &OwnedTree) {
            assert!(decoded.is_err(), "{member}: the streamed parse refused what decode accepts: {e}");
        }
    }
});
