//! Typed errors of the layout core. Every variant names the offending field and value and says
//! how to fix it; the Python glue maps each [`LayoutError::kind`] to one exception class.

use thiserror::Error;

/// Largest world the core accepts: torch stores ranks as int32.
pub const MAX_WORLD_SIZE: u64 = i32::MAX as u64;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LayoutError {
    #[error("{field} must be a positive integer, got {value}; every mesh dimension needs at least one rank")]
    InvalidSize { field: String, value: i128 },

    #[error("{field}: {detail}")]
    SizeMismatch { field: String, detail: String },

    #[error("{field} = {value} overflows: {detail}")]
    Overflow {
        field: String,
        value: String,
        detail: String,
    },

    #[error("unknown mesh dimension name {name:?}; available names are {available:?}")]
    UnknownName {
        name: String,
        available: Vec<String>,
    },

    #[error(
        "duplicate mesh dimension name {name:?} in {field}; every dimension needs a unique name"
    )]
    DuplicateName { field: String, name: String },

    #[error("invalid mesh dimension name {name:?} in {field}: {detail}")]
    InvalidName {
        field: String,
        name: String,
        detail: String,
    },

    #[error("names {names:?} are not in mesh order {mesh_order:?}; slice them in mesh order, e.g. [{}]",
        .fix.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", "))]
    SliceOrder {
        names: Vec<String>,
        mesh_order: Vec<String>,
        fix: Vec<String>,
    },

    #[error("an empty slice selects no dimension; name at least one of {available:?}")]
    EmptySlice { available: Vec<String> },

    #[error("rank = {rank} is out of range for a world of {world_size} ranks; valid ranks are 0..{world_size}")]
    RankOutOfRange { rank: i128, world_size: u64 },

    #[error("dim = {dim} is out of range for a mesh with {ndim} dimensions {names:?}")]
    DimOutOfRange {
        dim: i128,
        ndim: usize,
        names: Vec<String>,
    },

    #[error("rank_map is not a permutation of range({world_size}): {detail}")]
    InvalidRankMap { world_size: u64, detail: String },

    #[error("{field}: {detail}")]
    Incompatible { field: String, detail: String },

    #[error("{field}: {detail}")]
    InvalidLayout { field: String, detail: String },
}

impl LayoutError {
    /// The name of the Python exception class this error maps to (in `rankmesh.errors`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InvalidSize { .. } => "InvalidSizeError",
            Self::SizeMismatch { .. } => "SizeMismatchError",
            Self::Overflow { .. } => "LayoutOverflowError",
            Self::UnknownName { .. } => "UnknownNameError",
            Self::DuplicateName { .. } => "DuplicateNameError",
            Self::InvalidName { .. } => "InvalidNameError",
            Self::SliceOrder { .. } => "SliceOrderError",
            Self::EmptySlice { .. } => "EmptySliceError",
            Self::RankOutOfRange { .. } => "RankOutOfRangeError",
            Self::DimOutOfRange { .. } => "DimOutOfRangeError",
            Self::InvalidRankMap { .. } => "InvalidRankMapError",
            Self::Incompatible { .. } => "IncompatibleLayoutError",
            Self::InvalidLayout { .. } => "InvalidLayoutError",
        }
    }

    /// The field the error is about (argument name, possibly indexed, e.g. `sizes[1]`).
    pub fn field(&self) -> String {
        match self {
            Self::InvalidSize { field, .. }
            | Self::SizeMismatch { field, .. }
            | Self::Overflow { field, .. }
            | Self::DuplicateName { field, .. }
            | Self::InvalidName { field, .. }
            | Self::Incompatible { field, .. }
            | Self::InvalidLayout { field, .. } => field.clone(),
            Self::UnknownName { .. } | Self::SliceOrder { .. } | Self::EmptySlice { .. } => {
                "names".into()
            }
            Self::RankOutOfRange { .. } => "rank".into(),
            Self::DimOutOfRange { .. } => "dim".into(),
            Self::InvalidRankMap { .. } => "rank_map".into(),
        }
    }

    /// The offending value, rendered as text.
    pub fn value(&self) -> String {
        match self {
            Self::InvalidSize { value, .. } => value.to_string(),
            Self::Overflow { value, .. } => value.clone(),
            Self::UnknownName { name, .. }
            | Self::DuplicateName { name, .. }
            | Self::InvalidName { name, .. } => name.clone(),
            Self::SliceOrder { names, .. } => format!("{names:?}"),
            Self::EmptySlice { .. } => "()".into(),
            Self::RankOutOfRange { rank, .. } => rank.to_string(),
            Self::DimOutOfRange { dim, .. } => dim.to_string(),
            Self::SizeMismatch { detail, .. }
            | Self::InvalidRankMap { detail, .. }
            | Self::Incompatible { detail, .. }
            | Self::InvalidLayout { detail, .. } => detail.clone(),
        }
    }
}

pub type Result<T> = std::result::Result<T, LayoutError>;
