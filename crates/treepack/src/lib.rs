//! treepack: save and load trees of arrays, scalars, strings and bytes.
pub mod codec;
pub mod dtype;
pub mod error;
pub mod grid;
pub mod hash;
pub mod keypath;
pub mod manifest;
pub mod model;

pub use error::{Error, Result};
