//! Property laws of the layout algebra (proptest).
