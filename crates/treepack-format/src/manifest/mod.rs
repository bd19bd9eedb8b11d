//! The manifest (`treepack.json`): the tree's structure, inline values, and where every chunk
//! lives. Written as compact JSON by hand (fast, deterministic) and parsed by a strict streaming
//! visitor that bounds depth, rejects duplicates, and reports the key path of any problem.
//!
//! The normative description is docs/format.md; this module is its reference implementation:
//! [`types`](self) and limits (`types.rs`), the writer (`write.rs`), the checks (`validate.rs`),
//! and two readers of one grammar — the one-pass parser that drives a [`Build`]er (`parse.rs`,
//! `nodes.rs`, `split.rs` for big containers on more threads with `tape.rs`, `build.rs`) and the structure-only
//! [`outline`] — sharing the member readers in `members.rs`.

use crate::codec::Codec;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::grid::ChunkGrid;
use crate::hash::Hash32;
use crate::keypath::KeyPath;
use crate::model::{shape_len, Int, Key, Step, Tree};
use crate::refs::{check_refs_with, RefCheck};
use base64::Engine;
use bytes::Bytes;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;

mod build;
mod fragment;
mod members;
mod nodes;
pub mod outline;
mod parse;
mod split;
mod tape;
#[cfg(test)]
pub(crate) mod tests;
pub(crate) mod text;
mod types;
mod validate;
mod write;

pub use build::*;
pub use fragment::*;
use members::*;
use nodes::*;
pub use parse::*;
use split::*;
pub use tape::*;
pub use types::*;
pub use validate::*;
pub use write::*;
