//! placeholder
pub fn to_tree(){} pub fn from_tree(){}
