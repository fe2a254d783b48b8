//! rankmesh core: DeviceMesh rank layouts for very large worlds.
//!
//! A rank needs only its own groups; each is a pure function of (layout, rank) and costs
//! O(group size). See [`layout`] for the algebra and [`hashes`] for the two torch/CPython hashes
//! rankmesh computes natively. The PyO3 glue lives in one module behind the `python` feature;
//! everything else builds and tests with plain `cargo test`.

pub mod error;
pub mod hashes;
pub mod layout;
pub mod slice;

pub use error::{LayoutError, Result, Value, MAX_WORLD_SIZE};
pub use layout::{Axis, Layout, Mode, World};
pub use slice::Slice;

#[cfg(feature = "python")]
mod python;
