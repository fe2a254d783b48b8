//! Typed errors of the layout core. Every variant names the offending field, carries the offending
//! value as data (never as prose) and says how to fix it in its message. The Python glue
//! (`rust/python.rs`) maps each variant to one exception class of `rankmesh.errors`, with the value
//! converted to the matching Python object.

use thiserror::Error;

/// Largest world the core accepts: torch stores ranks as int32.
pub const MAX_WORLD_SIZE: u64 = i32::MAX as u64;

/// An offending value whose type depends on where the error arises (e.g. a size mismatch is
/// about the sizes, or about the names). The Python glue turns it into the matching object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// One integer (a size, a length, a rank): a Python `int`.
    Int(i128),
    /// Several integers (the sizes as given, a `(size, stride)` mode, a shape): a `tuple` of `int`.
    Ints(Vec<i128>),
    /// Names as given: a `tuple` of `str`.
    Names(Vec<String>),
    /// `(size, stride)` modes per dim, as `MeshLayout.with_modes` takes them: a `list` of `list`s
    /// of `(int, int)` tuples.
    Modes(Vec<Vec<(u64, u64)>>),
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LayoutError {
    /// A size `<= 0`; `value` is that size.
    #[error("{field} must be a positive integer, got {value}; every mesh dimension needs at least one rank")]
    InvalidSize { field: String, value: i128 },

    /// Sizes (or names) that do not match what they must. `value` is what `field` names: the sizes
    /// as given ([`Value::Ints`]) or the names as given ([`Value::Names`]).
    #[error("{field}: {detail}")]
    SizeMismatch {
        field: String,
        value: Value,
        detail: String,
    },

    /// A value too large for the core. `field` names the culprit argument itself (e.g.
    /// `world_size`, `sizes[2]`, `axes[0][1]`), never a derived quantity; `value` is that
    /// argument's value ([`Value::Int`], or [`Value::Ints`] for a `(size, stride)` mode).
    #[error("{field} = {} overflows: {detail}", show(.value))]
    Overflow {
        field: String,
        value: Value,
        detail: String,
    },

    /// `value` (in Python) is `name`; the field is `names`.
    #[error("unknown mesh dimension name {name:?}; available names are {available:?}")]
    UnknownName {
        name: String,
        available: Vec<String>,
    },

    /// `value` (in Python) is `name`, the first repeated name.
    #[error(
        "duplicate mesh dimension name {name:?} in {field}; every dimension needs a unique name"
    )]
    DuplicateName { field: String, name: String },

    /// A flatten name that a dim of the root already has (`value` in Python is `name`; `root` are
    /// the root's names). torch refuses the same ("already exists for submesh of the root mesh").
    #[error(
        "{field} = {name:?} already names a dim of the root mesh {root:?}; a flattened dim needs a \
         name the root does not use, e.g. {:?}",
        suggest_name(name, root)
    )]
    RootNameTaken {
        field: String,
        name: String,
        root: Vec<String>,
    },

    /// `value` (in Python) is `name`.
    #[error("invalid mesh dimension name {name:?} in {field}: {detail}")]
    InvalidName {
        field: String,
        name: String,
        detail: String,
    },

    /// `value` (in Python) is `names` as given; `fix` is an order of the same names that slices.
    #[error("names {names:?} are not in mesh order {mesh_order:?}; slice them in mesh order, e.g. [{}]",
        .fix.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", "))]
    SliceOrder {
        names: Vec<String>,
        mesh_order: Vec<String>,
        fix: Vec<String>,
    },

    /// `value` (in Python) is `()`.
    #[error("an empty slice selects no dimension; name at least one of {available:?}")]
    EmptySlice { available: Vec<String> },

    /// `value` (in Python) is `rank`.
    #[error("rank = {rank} is out of range for a world of {world_size} ranks; valid ranks are 0..{world_size}")]
    RankOutOfRange { rank: i128, world_size: u64 },

    /// A rank of the job that is not one of a placed world's ranks (a mesh over part of the job);
    /// `value` (in Python) is `rank`.
    #[error("rank = {rank} is not one of this mesh's ranks ({ranks}); ask a rank of the mesh, or check is_member(rank) first")]
    NotAMember { rank: i128, ranks: String },

    /// `value` (in Python) is `dim`, as given (negative dims count from the end).
    #[error("dim = {dim} is out of range for a mesh with {ndim} dimensions {names:?}; valid dims are 0..{ndim}, or -{ndim}..-1 counting from the end")]
    DimOutOfRange {
        dim: i128,
        ndim: usize,
        names: Vec<String>,
    },

    /// A rank map that is not a permutation of `range(world_size)`; the field is `rank_map`.
    /// `value` depends on the fault, and `detail` names the index at fault:
    /// * wrong length: the number of entries ([`Value::Int`]);
    /// * an entry outside `0..world_size`: that entry ([`Value::Int`]);
    /// * a rank that appears twice: that rank ([`Value::Int`]);
    /// * not 1-D (found by the Python glue): its shape ([`Value::Ints`]).
    #[error("rank_map is not a permutation of range({world_size}): {detail}")]
    InvalidRankMap {
        world_size: u64,
        value: Value,
        detail: String,
    },

    /// Sizes that the dim's modes cannot express; `sizes` (the value in Python) are as given.
    #[error("{field}: {detail}")]
    Incompatible {
        field: String,
        sizes: Vec<i128>,
        detail: String,
    },

    /// Raw modes that do not describe a layout of the world. `value` is what `field` names: one
    /// mode `(size, stride)` ([`Value::Ints`]) for `axes[a][k]`, or every dim's modes
    /// ([`Value::Modes`]) for `axes` when the fault lies between modes.
    #[error("{field}: {detail}")]
    InvalidLayout {
        field: String,
        value: Value,
        detail: String,
    },
}

/// A name like `name` that `taken` does not hold: `name` with `_flat` (then `_flat2`, ...) added.
fn suggest_name(name: &str, taken: &[String]) -> String {
    (1..)
        .map(|k| match k {
            1 => format!("{name}_flat"),
            _ => format!("{name}_flat{k}"),
        })
        .find(|n| !taken.contains(n))
        .unwrap_or_default()
}

/// A value as the message shows it: Python syntax, so it reads like what the caller wrote.
fn show(value: &Value) -> String {
    fn tuple<T: ToString>(items: impl IntoIterator<Item = T>) -> String {
        let items: Vec<String> = items.into_iter().map(|x| x.to_string()).collect();
        match items.len() {
            1 => format!("({},)", items[0]),
            _ => format!("({})", items.join(", ")),
        }
    }
    match value {
        Value::Int(v) => v.to_string(),
        Value::Ints(v) => tuple(v),
        Value::Names(v) => tuple(v.iter().map(|n| format!("{n:?}"))),
        Value::Modes(v) => {
            let dims: Vec<String> = v
                .iter()
                .map(|a| {
                    format!(
                        "[{}]",
                        a.iter()
                            .map(|(s, d)| format!("({s}, {d})"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
                .collect();
            format!("[{}]", dims.join(", "))
        }
    }
}

impl LayoutError {
    /// The field the error is about (argument name, possibly indexed, e.g. `sizes[1]`).
    pub fn field(&self) -> &str {
        match self {
            Self::InvalidSize { field, .. }
            | Self::SizeMismatch { field, .. }
            | Self::Overflow { field, .. }
            | Self::DuplicateName { field, .. }
            | Self::RootNameTaken { field, .. }
            | Self::InvalidName { field, .. }
            | Self::Incompatible { field, .. }
            | Self::InvalidLayout { field, .. } => field,
            Self::UnknownName { .. } | Self::SliceOrder { .. } | Self::EmptySlice { .. } => "names",
            Self::RankOutOfRange { .. } | Self::NotAMember { .. } => "rank",
            Self::DimOutOfRange { .. } => "dim",
            Self::InvalidRankMap { .. } => "rank_map",
        }
    }
}

pub type Result<T> = std::result::Result<T, LayoutError>;
