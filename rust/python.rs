//! The PyO3 edge: `rankmesh._native`. The only module that knows about Python.
//!
//! Every call into the core goes through [`guarded`], which releases the GIL, turns a panic into
//! `rankmesh.errors.InternalError` and maps each [`LayoutError`] to its typed exception class in
//! `rankmesh.errors` (one `match`, in [`to_pyerr`]), with the offending value as a Python object.
//! Arguments are read by one rule (`rankmesh._check`'s): a wrong type raises `ArgumentTypeError`.
//! Arrays leave as numpy int32, C-contiguous, built from the Rust `Vec` without copying.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use numpy::{PyArray1, PyArrayDyn, PyArrayMethods, PyReadonlyArray1};
use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyList, PyString, PyTuple};
use pyo3::PyTypeInfo;

use crate::error::{LayoutError, Value};
use crate::layout::{check_world_size, Layout, World};
use crate::slice::Slice;

/// The classes of `rankmesh.errors` the glue raises, imported once each.
mod errors {
    use pyo3::import_exception;

    import_exception!(rankmesh.errors, InvalidSizeError);
    import_exception!(rankmesh.errors, SizeMismatchError);
    import_exception!(rankmesh.errors, LayoutOverflowError);
    import_exception!(rankmesh.errors, UnknownNameError);
    import_exception!(rankmesh.errors, DuplicateNameError);
    import_exception!(rankmesh.errors, InvalidNameError);
    import_exception!(rankmesh.errors, SliceOrderError);
    import_exception!(rankmesh.errors, EmptySliceError);
    import_exception!(rankmesh.errors, RankOutOfRangeError);
    import_exception!(rankmesh.errors, DimOutOfRangeError);
    import_exception!(rankmesh.errors, InvalidRankMapError);
    import_exception!(rankmesh.errors, IncompatibleLayoutError);
    import_exception!(rankmesh.errors, InvalidLayoutError);
    import_exception!(rankmesh.errors, ArgumentTypeError);
    import_exception!(rankmesh.errors, InternalError);
}
use errors::*;

/// `T(message, field=field, value=value)`, an instance of a `rankmesh.errors` class.
fn new_error<'py, T: PyTypeInfo>(
    py: Python<'py>,
    message: String,
    field: &str,
    value: impl IntoPyObject<'py>,
) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let kwargs = PyDict::new(py);
        kwargs.set_item("field", field)?;
        kwargs.set_item("value", value)?;
        Ok(PyErr::from_value(
            T::type_object(py).call((message,), Some(&kwargs))?,
        ))
    };
    build().unwrap_or_else(|err| err)
}

/// A core [`Value`] as the Python object it stands for.
fn value_object<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Int(v) => v.into_pyobject(py)?.into_any(),
        Value::Ints(v) => PyTuple::new(py, v)?.into_any(),
        Value::Names(v) => PyTuple::new(py, v)?.into_any(),
        Value::Modes(v) => v.into_pyobject(py)?.into_any(),
    })
}

/// The one mapping of core errors to Python: each variant to its class in `rankmesh.errors`,
/// with `field` and the offending value as a Python object (see each variant's docs).
fn to_pyerr(py: Python<'_>, e: &LayoutError) -> PyErr {
    use LayoutError as E;
    let (message, field) = (e.to_string(), e.field());
    let build = || -> PyResult<PyErr> {
        Ok(match e {
            E::InvalidSize { value, .. } => {
                new_error::<InvalidSizeError>(py, message, field, *value)
            }
            E::SizeMismatch { value, .. } => {
                new_error::<SizeMismatchError>(py, message, field, value_object(py, value)?)
            }
            E::Overflow { value, .. } => {
                new_error::<LayoutOverflowError>(py, message, field, value_object(py, value)?)
            }
            E::UnknownName { name, .. } => new_error::<UnknownNameError>(py, message, field, name),
            E::DuplicateName { name, .. } | E::RootNameTaken { name, .. } => {
                new_error::<DuplicateNameError>(py, message, field, name)
            }
            E::InvalidName { name, .. } => new_error::<InvalidNameError>(py, message, field, name),
            E::SliceOrder { names, .. } => {
                new_error::<SliceOrderError>(py, message, field, PyTuple::new(py, names)?)
            }
            E::EmptySlice { .. } => {
                new_error::<EmptySliceError>(py, message, field, PyTuple::empty(py))
            }
            E::RankOutOfRange { rank, .. } | E::NotAMember { rank, .. } => {
                new_error::<RankOutOfRangeError>(py, message, field, *rank)
            }
            E::DimOutOfRange { dim, .. } => {
                new_error::<DimOutOfRangeError>(py, message, field, *dim)
            }
            E::InvalidRankMap { value, .. } => {
                new_error::<InvalidRankMapError>(py, message, field, value_object(py, value)?)
            }
            E::Incompatible { sizes, .. } => {
                new_error::<IncompatibleLayoutError>(py, message, field, PyTuple::new(py, sizes)?)
            }
            E::InvalidLayout { value, .. } => {
                new_error::<InvalidLayoutError>(py, message, field, value_object(py, value)?)
            }
        })
    };
    build().unwrap_or_else(|err| err)
}

/// Runs core work with the GIL released; panics and core errors become typed Python errors.
fn guarded<T, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    T: Send,
    F: FnOnce() -> Result<T, LayoutError> + Send,
{
    match py.detach(|| catch_unwind(AssertUnwindSafe(f))) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(to_pyerr(py, &e)),
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            let message = format!("internal error in rankmesh's core (please report it): {msg}");
            Err(new_error::<InternalError>(py, message, "", msg))
        }
    }
}

/// `type value` for messages, e.g. `float 2.0` (the repr cut short if very long).
fn describe(obj: &Bound<'_, PyAny>) -> String {
    let ty = obj
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into());
    let repr = obj
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "<unprintable>".into());
    if repr.chars().count() > 80 {
        format!("{ty} {}...", repr.chars().take(77).collect::<String>())
    } else {
        format!("{ty} {repr}")
    }
}

/// `ArgumentTypeError(message, field=field, value=obj)`.
fn type_error(py: Python<'_>, message: String, field: &str, obj: &Bound<'_, PyAny>) -> PyErr {
    new_error::<ArgumentTypeError>(py, message, field, obj)
}

/// Extracts an integer by `rankmesh._check`'s rule: anything with `__index__` (numpy integers
/// included) except `bool`; floats (even `2.0`) and strings raise `ArgumentTypeError`, and an
/// integer beyond 128 bits `LayoutOverflowError`, each naming `field` and holding `obj`.
fn int_arg(py: Python<'_>, obj: &Bound<'_, PyAny>, field: &str) -> PyResult<i128> {
    if obj.is_instance_of::<PyBool>() {
        let message = format!(
            "{field} must be an int, got {}; write the number itself",
            describe(obj)
        );
        return Err(type_error(py, message, field, obj));
    }
    match obj.extract::<i128>() {
        Ok(v) => Ok(v),
        Err(e) if e.is_instance_of::<PyOverflowError>(py) => {
            // str() refuses ints of more than 4300 digits: say how big it is instead
            let shown = obj.str().map(|s| s.to_string()).unwrap_or_else(|_| {
                let bits = obj
                    .call_method0("bit_length")
                    .map(|b| b.to_string())
                    .unwrap_or_default();
                format!("<an int of {bits} bits>")
            });
            let message = format!(
                "{field} = {shown} overflows: it does not fit a 128-bit integer, and no size, rank or dim of a \
                 world of at most {} ranks comes near",
                crate::error::MAX_WORLD_SIZE
            );
            Err(new_error::<LayoutOverflowError>(py, message, field, obj))
        }
        Err(_) => Err(type_error(
            py,
            format!("{field} must be an int, got {}", describe(obj)),
            field,
            obj,
        )),
    }
}

/// The items of a sequence argument; a `str` or `bytes` (an easy slip for one name) or a
/// non-iterable raises `ArgumentTypeError` naming `field`.
fn items_arg<'py>(
    py: Python<'py>,
    obj: &Bound<'py, PyAny>,
    field: &str,
    what: &str,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        let message = format!(
            "{field} must be a sequence of {what}, got {}; wrap it, e.g. ({},)",
            describe(obj),
            obj.repr().map(|r| r.to_string()).unwrap_or_default()
        );
        return Err(type_error(py, message, field, obj));
    }
    match obj.try_iter() {
        Ok(it) => it.collect(),
        Err(_) => Err(type_error(
            py,
            format!(
                "{field} must be a sequence of {what}, got {}",
                describe(obj)
            ),
            field,
            obj,
        )),
    }
}

/// One name, by `rankmesh._check.check_str`'s rule: a `str` that is valid UTF-8 text; anything
/// else (another type, or a `str` holding a lone surrogate such as `"\ud800"`, which has no UTF-8
/// form) raises `ArgumentTypeError` naming `field` and holding `obj`.
fn name_arg(py: Python<'_>, obj: &Bound<'_, PyAny>, field: &str) -> PyResult<String> {
    let Ok(s) = obj.cast::<PyString>() else {
        return Err(type_error(
            py,
            format!("{field} must be a str, got {}", describe(obj)),
            field,
            obj,
        ));
    };
    s.to_str().map(str::to_string).map_err(|_| {
        let message = format!(
            "{field} must be valid UTF-8 text, got {}, which holds a lone surrogate (a str made by \
             decoding bytes with errors='surrogateescape' or 'surrogatepass'); pass the name as \
             ordinary text",
            describe(obj)
        );
        type_error(py, message, field, obj)
    })
}

/// A sequence of names; a wrong-type entry is blamed as `field[i]`.
fn names_arg(py: Python<'_>, obj: &Bound<'_, PyAny>, field: &str) -> PyResult<Vec<String>> {
    let items = items_arg(py, obj, field, "str names")?;
    items
        .iter()
        .enumerate()
        .map(|(i, x)| name_arg(py, x, &format!("{field}[{i}]")))
        .collect()
}

/// Raw modes per dim, `[[(size, stride), ...], ...]`, as `with_modes` and unpickling take them.
/// Wrong types raise `ArgumentTypeError`, a mode that is not a pair `InvalidLayoutError`, each
/// naming the place (`axes[a][k]`); the core checks the values (`Layout::from_raw_parts`).
fn axes_arg(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<(i128, i128)>>> {
    let mut axes = Vec::new();
    for (a, axis) in items_arg(py, obj, "axes", "dims' modes")?
        .iter()
        .enumerate()
    {
        let mut modes = Vec::new();
        for (k, mode) in items_arg(py, axis, &format!("axes[{a}]"), "(size, stride) modes")?
            .iter()
            .enumerate()
        {
            let field = format!("axes[{a}][{k}]");
            let pair = items_arg(py, mode, &field, "two ints")?;
            if pair.len() != 2 {
                let message = format!(
                    "{field} must be a (size, stride) pair, got {} items: {}",
                    pair.len(),
                    describe(mode)
                );
                return Err(new_error::<InvalidLayoutError>(py, message, &field, mode));
            }
            modes.push((
                int_arg(py, &pair[0], &format!("{field}[0]"))?,
                int_arg(py, &pair[1], &format!("{field}[1]"))?,
            ));
        }
        axes.push(modes);
    }
    Ok(axes)
}

/// One list of `(size, stride)` modes (a placement's, a slice's), read as the one dim of
/// [`axes_arg`] (so a fault is named as there: `axes[0][k]`).
fn modes_arg(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Vec<(i128, i128)>> {
    let list = PyList::new(py, [obj])?;
    Ok(axes_arg(py, list.as_any())?.pop().unwrap_or_default())
}

/// Converts a 1-D sequence or array of integer ranks to a contiguous int64 numpy array.
/// Non-integer entries (floats, bools, strings) and what numpy cannot read raise
/// `ArgumentTypeError`; an array that is not 1-D and an entry beyond int64 raise
/// `InvalidRankMapError` (the core checks the rest).
fn rank_map_arg<'py>(
    py: Python<'py>,
    obj: &Bound<'py, PyAny>,
    world_size: u64,
) -> PyResult<PyReadonlyArray1<'py, i64>> {
    let np = py.import("numpy")?;
    let field = "rank_map";
    let wrong_type = |what: String, value: &Bound<'py, PyAny>| {
        type_error(py, format!("rank_map must be a 1-D sequence of int ranks (a permutation of range({world_size})), {what}"), field, value)
    };
    let entry_outside = |i: usize, v: &Bound<'py, PyAny>| {
        let message = format!("rank_map is not a permutation of range({world_size}): rank_map[{i}] = {v} is outside 0..{world_size}");
        match v.extract::<i128>() {
            Ok(n) => to_pyerr(
                py,
                &LayoutError::InvalidRankMap {
                    world_size,
                    value: Value::Int(n),
                    detail: format!("rank_map[{i}] = {n} is outside 0..{world_size}"),
                },
            ),
            Err(_) => new_error::<InvalidRankMapError>(py, message, field, v),
        }
    };
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(wrong_type(format!("got {}", describe(obj)), obj));
    }
    let arr = match np.call_method1("asarray", (obj,)) {
        Ok(arr) => arr,
        Err(e) => {
            let err = wrong_type(
                format!("but numpy cannot read {} as an array: {e}", describe(obj)),
                obj,
            );
            err.set_cause(py, Some(e));
            return Err(err);
        }
    };
    let ndim: usize = arr.getattr("ndim")?.extract()?;
    if ndim == 0 {
        return Err(wrong_type(format!("got {}", describe(obj)), obj));
    }
    if ndim != 1 {
        let shape: Vec<i128> = arr.getattr("shape")?.extract()?;
        let detail = format!("it must be 1-D, got {ndim} dimensions of shape {shape:?}");
        return Err(to_pyerr(
            py,
            &LayoutError::InvalidRankMap {
                world_size,
                value: Value::Ints(shape),
                detail,
            },
        ));
    }
    let dtype = arr.getattr("dtype")?;
    let kind: String = dtype.getattr("kind")?.extract()?;
    let len: usize = arr.getattr("size")?.extract()?;
    match kind.as_str() {
        "i" => {}
        "u" if dtype.getattr("itemsize")?.extract::<usize>()? < 8 => {}
        "u" => {
            // uint64 entries beyond int64 would wrap in the conversion: report them as they are
            let big =
                np.call_method1("flatnonzero", (arr.call_method1("__gt__", (i64::MAX,))?,))?;
            if big.len()? > 0 {
                let i: usize = big.get_item(0)?.extract()?;
                return Err(entry_outside(i, &arr.get_item(i)?.call_method0("item")?));
            }
        }
        _ if len == 0 => {} // `[]` reads as float64; its length is what is wrong
        "O" => {
            // mixed Python objects, or ints beyond int64: find the first entry at fault
            for (i, x) in arr.call_method0("tolist")?.try_iter()?.enumerate() {
                let x = x?;
                match int_arg(py, &x, &format!("rank_map[{i}]")) {
                    Ok(v) if i64::try_from(v).is_ok() => {}
                    Ok(_) => return Err(entry_outside(i, &x)),
                    Err(e) if e.is_instance_of::<PyOverflowError>(py) => {
                        return Err(entry_outside(i, &x))
                    }
                    Err(_) => {
                        let what = format!("got {} at rank_map[{i}]", describe(&x));
                        return Err(wrong_type(what, &x));
                    }
                }
            }
        }
        _ => {
            let first = arr.get_item(0)?.call_method0("item")?;
            let what = format!(
                "got {} entries such as rank_map[0] = {}",
                dtype.str()?,
                first.repr()?
            );
            return Err(wrong_type(what, &first));
        }
    }
    let arr = np.call_method1("ascontiguousarray", (arr, "int64"))?;
    Ok(arr.extract()?)
}

fn int32_array<'py>(
    py: Python<'py>,
    data: Vec<i32>,
    shape: Vec<usize>,
) -> PyResult<Bound<'py, PyArrayDyn<i32>>> {
    PyArray1::from_vec(py, data).reshape(shape)
}

/// An immutable DeviceMesh rank layout over one world (see `rankmesh.MeshLayout`'s docs).
#[pyclass(module = "rankmesh", name = "MeshLayout", frozen)]
pub struct PyMeshLayout {
    inner: Layout,
}

impl PyMeshLayout {
    fn dim_arg(&self, py: Python<'_>, dim: &Bound<'_, PyAny>) -> PyResult<usize> {
        let r = if dim.is_instance_of::<PyString>() {
            self.inner.dim_by_name(&name_arg(py, dim, "dim")?)
        } else {
            self.inner.dim_index(int_arg(py, dim, "dim")?)
        };
        r.map_err(|e| to_pyerr(py, &e))
    }

    fn wrap(inner: Layout) -> Self {
        PyMeshLayout { inner }
    }
}

/// `(old_world_size, removed, [(index, spare rank), ...])` of a renumbered world.
type RenumberingParts = (u64, Vec<u64>, Vec<(u64, u64)>);

#[pymethods]
impl PyMeshLayout {
    /// The 1-D mesh of `world_size` ranks named "world"; `rank_map[i]` is the rank at index `i`.
    #[staticmethod]
    #[pyo3(signature = (world_size, rank_map = None))]
    fn world(
        py: Python<'_>,
        world_size: &Bound<'_, PyAny>,
        rank_map: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let size = int_arg(py, world_size, "world_size")?;
        let valid = check_world_size(size).map_err(|e| to_pyerr(py, &e))?; // before the rank map
        let layout = match rank_map {
            None => guarded(py, || Layout::world(size, None))?,
            Some(obj) => {
                let arr = rank_map_arg(py, obj, valid)?;
                let slice = arr.as_slice()?;
                guarded(py, || Layout::world(size, Some(slice)))?
            }
        };
        Ok(Self::wrap(layout))
    }

    /// The 1-D mesh named "world" re-formed after a failure, stored in O(changes): before it,
    /// index `i` was rank `i` of a job of `old_world_size` ranks (`size` of them in the mesh, the
    /// rest spares); the old ranks `removed` left the job, the spare of old rank `r` takes index
    /// `i` for each `i: r` in `replaced`, and the ranks still alive are renumbered in order, as
    /// torch's `shrink_group` and an ordered re-rendezvous do (new rank = old rank - the removed
    /// ranks below it). Every rank of the new job holds an index. Use
    /// `rankmesh.recovery.hot_spare` to build it from what failed.
    #[staticmethod]
    #[pyo3(signature = (old_world_size, size, removed, replaced))]
    fn renumbered(
        py: Python<'_>,
        old_world_size: &Bound<'_, PyAny>,
        size: &Bound<'_, PyAny>,
        removed: &Bound<'_, PyAny>,
        replaced: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let old = int_arg(py, old_world_size, "old_world_size")?;
        let size = int_arg(py, size, "size")?;
        let mut gone = Vec::new();
        for (k, r) in removed.try_iter()?.enumerate() {
            gone.push(int_arg(py, &r?, &format!("removed[{k}]"))?);
        }
        let mut pairs = Vec::new();
        let items = if replaced.is_instance_of::<pyo3::types::PyDict>() {
            replaced.call_method0("items")?
        } else {
            replaced.clone()
        };
        for (k, item) in items.try_iter()?.enumerate() {
            let item = item?;
            let field = format!("replaced[{k}]");
            let pair: Vec<Bound<'_, PyAny>> = item
                .try_iter()
                .and_then(|it| it.collect::<PyResult<Vec<_>>>())
                .map_err(|_| {
                    type_error(
                        py,
                        format!(
                            "{field} must be an (index, spare rank) pair, got {}",
                            describe(&item)
                        ),
                        &field,
                        &item,
                    )
                })?;
            if pair.len() != 2 {
                return Err(type_error(
                    py,
                    format!(
                        "{field} must be an (index, spare rank) pair, got {}",
                        describe(&item)
                    ),
                    &field,
                    &item,
                ));
            }
            pairs.push((
                int_arg(py, &pair[0], &field)?,
                int_arg(py, &pair[1], &field)?,
            ));
        }
        guarded(py, || Layout::renumbered(old, size, &gone, &pairs)).map(Self::wrap)
    }

    /// `(old_world_size, removed, {index: spare rank})` of a world re-formed after a failure
    /// (`MeshLayout.renumbered`), or None.
    #[getter]
    fn renumbering(&self) -> Option<RenumberingParts> {
        self.inner
            .world_arc()
            .renumbering()
            .map(|n| (n.old_global, n.removed.clone(), n.replaced.clone()))
    }

    /// The 1-D mesh named "world" over part of a job of `world_size` ranks: index `i` is rank
    /// `offset + sum(digit_k(i) * stride_k)` for `modes` `[(size, stride), ...]`.
    #[staticmethod]
    #[pyo3(signature = (world_size, offset, modes))]
    fn placed(
        py: Python<'_>,
        world_size: &Bound<'_, PyAny>,
        offset: &Bound<'_, PyAny>,
        modes: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let size = int_arg(py, world_size, "world_size")?;
        let off = int_arg(py, offset, "offset")?;
        let modes = modes_arg(py, modes)?;
        guarded(py, || Layout::placed(size, off, &modes)).map(Self::wrap)
    }

    /// Whether `other` splits the job into the same groups as this layout (each copy of the mesh
    /// one group, as a set of ranks): O(modes) when the modes decide it, else O(world).
    fn same_groups(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        let Ok(other) = other.cast::<PyMeshLayout>() else {
            let message = format!("other must be a MeshLayout, got {}", describe(other));
            return Err(type_error(py, message, "other", other));
        };
        let other = &other.get().inner;
        Ok(py.detach(|| self.inner.same_groups(other)))
    }

    /// Ranks in the job: `world_size` unless the world is placed in a larger job.
    #[getter]
    fn global_size(&self) -> u64 {
        self.inner.global_size()
    }

    /// `(offset, [(size, stride), ...])` of a world over part of the job, or None.
    #[getter]
    fn placement(&self) -> Option<(u64, Vec<(u64, u64)>)> {
        self.inner.world_arc().placement().map(|p| {
            (
                p.offset(),
                p.modes().iter().map(|m| (m.size, m.stride)).collect(),
            )
        })
    }

    /// The 1-D "world" layout this layout derives from (O(1), the same shared world).
    fn world_layout(&self) -> Self {
        Self::wrap(self.inner.world_layout())
    }

    /// Whether `rank` of the job is one of the world's ranks (O(modes)).
    fn is_member(&self, py: Python<'_>, rank: &Bound<'_, PyAny>) -> PyResult<bool> {
        let r = int_arg(py, rank, "rank")?;
        Ok(self.inner.is_member(r))
    }

    /// Splits `dim` (name or index) into `sizes` named `names`, like `DeviceMesh._unflatten`.
    fn unflatten(
        &self,
        py: Python<'_>,
        dim: &Bound<'_, PyAny>,
        sizes: &Bound<'_, PyAny>,
        names: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let d = self.dim_arg(py, dim)?;
        let sizes: Vec<i128> = items_arg(py, sizes, "sizes", "ints")?
            .iter()
            .enumerate()
            .map(|(i, s)| int_arg(py, s, &format!("sizes[{i}]")))
            .collect::<PyResult<_>>()?;
        let names = names_arg(py, names, "names")?;
        let inner = &self.inner;
        guarded(py, || inner.unflatten(d, &sizes, &names)).map(Self::wrap)
    }

    /// Slices by one name or a tuple of names, in mesh order, like `DeviceMesh.__getitem__`.
    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Self> {
        let names: Vec<String> = if key.is_instance_of::<PyString>() {
            vec![name_arg(py, key, "names")?]
        } else if key.is_instance_of::<PyTuple>() || key.is_instance_of::<PyList>() {
            names_arg(py, key, "names")?
        } else {
            let message = format!(
                "index a MeshLayout with a dim name or a tuple of names, got {}",
                describe(key)
            );
            return Err(type_error(py, message, "names", key));
        };
        let inner = &self.inner;
        guarded(py, || inner.slice(&names)).map(Self::wrap)
    }

    /// A layout over this layout's world from raw `(size, stride)` modes per dim, validated
    /// (`InvalidLayoutError` when they overlap or do not tile the world). O(modes): the world
    /// and its rank map are shared, not copied.
    fn with_modes(
        &self,
        py: Python<'_>,
        axes: &Bound<'_, PyAny>,
        names: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let axes = axes_arg(py, axes)?;
        let names = names_arg(py, names, "names")?;
        let w: Arc<World> = self.inner.world_arc().clone();
        guarded(py, || Layout::from_raw_parts(w, &axes, &names)).map(Self::wrap)
    }

    /// A 1-D layout over all dims of this one (adjacent or not), like `DeviceMesh._flatten`.
    #[pyo3(signature = (name = None))]
    fn flatten(&self, py: Python<'_>, name: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let name = name.map(|n| name_arg(py, n, "name")).transpose()?;
        let inner = &self.inner;
        guarded(py, || inner.flatten(name.as_deref())).map(Self::wrap)
    }

    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.shape())
    }

    #[getter]
    fn names<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.names())
    }

    #[getter]
    fn ndim(&self) -> usize {
        self.inner.ndim()
    }

    #[getter]
    fn world_size(&self) -> u64 {
        self.inner.world_size()
    }

    /// Number of copies of this mesh that tile the world (rows of `groups()`).
    #[getter]
    fn num_copies(&self) -> u64 {
        self.inner.num_copies()
    }

    /// Ranks in one copy of the mesh, or the size of one dim, like `DeviceMesh.size()`.
    #[pyo3(signature = (dim = None))]
    fn size(&self, py: Python<'_>, dim: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
        match dim {
            None => Ok(self.inner.numel()),
            Some(d) => Ok(self.inner.axes()[self.dim_arg(py, d)?].numel()),
        }
    }

    /// The (size, stride) modes of one dim over the world index (torch's `_layout[dim]`).
    fn modes(&self, py: Python<'_>, dim: &Bound<'_, PyAny>) -> PyResult<Vec<(u64, u64)>> {
        let d = self.dim_arg(py, dim)?;
        Ok(self.inner.axes()[d]
            .modes()
            .iter()
            .map(|m| (m.size, m.stride))
            .collect())
    }

    /// Canonical (size, stride) modes of one dim's partition of the world, outermost first:
    /// two dims of one world with equal keys have the same groups (as sets of ranks).
    fn partition_key(&self, py: Python<'_>, dim: &Bound<'_, PyAny>) -> PyResult<Vec<(u64, u64)>> {
        let d = self.dim_arg(py, dim)?;
        let inner = &self.inner;
        let key = guarded(py, || inner.partition_key(d))?;
        Ok(key.iter().map(|m| (m.size, m.stride)).collect())
    }

    /// `rank`'s group along `dim` as a `Slice` (its ranks as a set, increasing), in O(modes); None
    /// when the world is not in rank order (read `group` then).
    fn group_slice(
        &self,
        py: Python<'_>,
        rank: &Bound<'_, PyAny>,
        dim: &Bound<'_, PyAny>,
    ) -> PyResult<Option<PySlice>> {
        let r = int_arg(py, rank, "rank")?;
        let d = self.dim_arg(py, dim)?;
        let inner = &self.inner;
        Ok(guarded(py, || inner.group_slice(r, d))?.map(|inner| PySlice { inner }))
    }

    /// Whether index `i` is rank `i` of the job for every index (no rank map, no placement): O(1).
    #[getter]
    fn in_rank_order(&self) -> bool {
        self.inner.world_arc().is_identity()
    }

    /// The rank map as an int32 array, or None for the identity.
    fn rank_map<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyArray1<i32>>> {
        self.inner
            .world_arc()
            .ranks()
            .map(|m| PyArray1::from_vec(py, m))
    }

    /// `hash(tuple(rank_map))` as CPython computes it (torch's `DeviceMesh.__hash__` hashes the
    /// W-long `_flatten_rank_map` tuple), without building the tuple: O(W) integer work with the
    /// GIL released, nothing world-sized allocated for the identity map. CPython >= 3.8 hashes a
    /// tuple with an xxHash-style loop over its items' hashes, and a small non-negative int
    /// hashes to itself; rankmesh's start-up self-check compares this with `hash(tuple(...))`
    /// and falls back to Python's own hash if the two ever differ.
    fn rank_map_tuple_hash(&self, py: Python<'_>) -> PyResult<i64> {
        let world = self.inner.world_arc().clone();
        guarded(py, move || {
            let n = world.size();
            Ok(crate::hashes::cpython_tuple_hash(
                n,
                (0..n).map(|i| world.rank_at(i) as i64),
            ))
        })
    }

    /// The local mesh a DeviceMesh of this layout holds on `rank`: int32 array of `shape`.
    fn mesh_of<'py>(
        &self,
        py: Python<'py>,
        rank: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArrayDyn<i32>>> {
        let r = int_arg(py, rank, "rank")?;
        let inner = &self.inner;
        let data = guarded(py, || inner.mesh_of(r))?;
        int32_array(
            py,
            data,
            inner.shape().iter().map(|&s| s as usize).collect(),
        )
    }

    /// `rank`'s coordinate, as `DeviceMesh.get_coordinate()` on that rank.
    fn coordinate_of<'py>(
        &self,
        py: Python<'py>,
        rank: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let r = int_arg(py, rank, "rank")?;
        let inner = &self.inner;
        PyTuple::new(py, guarded(py, || inner.coordinate_of(r))?)
    }

    /// The ranks of `rank`'s group in `dim` (who `get_group(dim)` connects): int32 1-D array.
    fn group<'py>(
        &self,
        py: Python<'py>,
        rank: &Bound<'py, PyAny>,
        dim: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let r = int_arg(py, rank, "rank")?;
        let d = self.dim_arg(py, dim)?;
        let inner = &self.inner;
        Ok(PyArray1::from_vec(py, guarded(py, || inner.group(r, d))?))
    }

    /// Which copy (row of `groups()`) holds `rank`.
    fn copy_index_of(&self, py: Python<'_>, rank: &Bound<'_, PyAny>) -> PyResult<u64> {
        let r = int_arg(py, rank, "rank")?;
        let inner = &self.inner;
        guarded(py, || inner.copy_index_of(r))
    }

    /// Every copy of the mesh: int32 array `(world_size // size(), *shape)`, torch's order.
    fn groups<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDyn<i32>>> {
        let inner = &self.inner;
        let data = guarded(py, || Ok(inner.groups()))?;
        let mut shape = vec![inner.num_copies() as usize];
        shape.extend(inner.shape().iter().map(|&s| s as usize));
        int32_array(py, data, shape)
    }

    /// A stable 64-bit hash of (world size, rank map, dims, names).
    fn fingerprint(&self, py: Python<'_>) -> PyResult<u64> {
        let inner = &self.inner;
        guarded(py, || Ok(inner.fingerprint()))
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyMeshLayout>()
            .map(|o| o.get().inner == self.inner)
            .unwrap_or(false)
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<u64> {
        self.fingerprint(py)
    }

    fn __len__(&self) -> usize {
        self.inner.ndim()
    }

    fn __repr__(&self) -> String {
        let dims: Vec<String> = self
            .inner
            .names()
            .iter()
            .zip(self.inner.axes())
            .map(|(n, a)| {
                let s: Vec<String> = a.modes().iter().map(|m| m.size.to_string()).collect();
                let d: Vec<String> = a.modes().iter().map(|m| m.stride.to_string()).collect();
                format!("{n}={} ({}):({})", a.numel(), s.join(","), d.join(","))
            })
            .collect();
        let world = self.inner.world_arc();
        let map = match (world.rank_map(), world.placement(), world.renumbering()) {
            (Some(_), _, _) => ", rank_map=<permutation>".to_string(),
            (None, Some(p), _) => format!(", global_size={}, ranks={}", p.global, p.describe()),
            (None, None, Some(n)) => format!(", rank_map=<{}>", n.describe()),
            (None, None, None) => String::new(),
        };
        format!(
            "MeshLayout([{}], world_size={}{map})",
            dims.join(", "),
            self.inner.world_size()
        )
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let this = slf.get();
        let restore = py.import("rankmesh._native")?.getattr("_restore")?;
        let axes: Vec<Vec<(u64, u64)>> = this
            .inner
            .axes()
            .iter()
            .map(|a| a.modes().iter().map(|m| (m.size, m.stride)).collect())
            .collect();
        let map = this
            .rank_map(py)
            .map(|a| a.into_any())
            .unwrap_or_else(|| py.None().into_bound(py));
        let (names, root) = (this.inner.names(), this.inner.root_names());
        if let Some(n) = this.inner.world_arc().renumbering() {
            // re-formed after a failure: the O(changes) renumbering travels, not the W-long map
            let parts = (
                this.inner.world_size(),
                py.None(),
                axes,
                names.to_vec(),
                root.to_vec(),
                (
                    n.old_global,
                    n.removed.clone(),
                    n.replaced.clone(),
                    "renumbered",
                ),
            );
            return Ok((restore, parts.into_pyobject(py)?));
        }
        if let Some(p) = this.inner.world_arc().placement() {
            // over part of the job: the placement travels instead of the W-long rank map
            let modes: Vec<(u64, u64)> = p.modes().iter().map(|m| (m.size, m.stride)).collect();
            let parts = (
                this.inner.world_size(),
                py.None(),
                axes,
                names.to_vec(),
                root.to_vec(),
                (p.global, p.offset(), modes),
            );
            return Ok((restore, parts.into_pyobject(py)?));
        }
        let args = if names == root {
            (this.inner.world_size(), map, axes, names.to_vec()).into_pyobject(py)?
        } else {
            // derived from another root: its names travel too, so a flatten refuses them
            let parts = (
                this.inner.world_size(),
                map,
                axes,
                names.to_vec(),
                root.to_vec(),
            );
            parts.into_pyobject(py)?
        };
        Ok((restore, args))
    }
}

/// Rebuilds a pickled MeshLayout from `(world_size, rank_map, axes, names[, root_names])`,
/// validating every part: whatever the payload holds, a failure is a typed `rankmesh.errors`
/// class naming its field. Without `root_names` the layout is a root of its own.
#[pyfunction]
#[pyo3(signature = (*state))]
fn _restore(py: Python<'_>, state: &Bound<'_, PyTuple>) -> PyResult<PyMeshLayout> {
    if !(4..=6).contains(&state.len()) {
        let message = format!(
            "a pickled MeshLayout has 4 parts (world_size, rank_map, axes, names), 5 (and root_names) or 6 (and a placement), \
             got {}; the pickle is corrupted",
            state.len()
        );
        return Err(new_error::<InvalidLayoutError>(
            py,
            message,
            "state",
            state.len(),
        ));
    }
    let rank_map = state.get_item(1)?;
    let rank_map = if rank_map.is_none() {
        None
    } else {
        Some(&rank_map)
    };
    let world = if state.len() == 6 {
        let placement = state.get_item(5)?;
        if let Ok(parts) = placement.cast::<PyTuple>() {
            if parts.len() == 4 {
                // (old_world_size, removed, replaced, "renumbered")
                let w = PyMeshLayout::renumbered(
                    py,
                    &parts.get_item(0)?,
                    &state.get_item(0)?,
                    &parts.get_item(1)?,
                    &parts.get_item(2)?,
                )?;
                let axes = axes_arg(py, &state.get_item(2)?)?;
                let names = names_arg(py, &state.get_item(3)?, "names")?;
                let root = names_arg(py, &state.get_item(4)?, "root_names")?;
                let w: Arc<World> = w.inner.world_arc().clone();
                return guarded(py, || {
                    Layout::from_raw_parts(w, &axes, &names)?.with_root_names(&root)
                })
                .map(PyMeshLayout::wrap);
            }
        }
        let parts = placement.cast::<PyTuple>().map_err(|_| {
            type_error(
                py,
                "a pickled placement is (global_size, offset, modes)".into(),
                "placement",
                &placement,
            )
        })?;
        if parts.len() != 3 {
            return Err(type_error(
                py,
                "a pickled placement is (global_size, offset, modes)".into(),
                "placement",
                &placement,
            ));
        }
        let w = PyMeshLayout::placed(
            py,
            &parts.get_item(0)?,
            &parts.get_item(1)?,
            &parts.get_item(2)?,
        )?;
        if w.inner.world_size() as i128 != int_arg(py, &state.get_item(0)?, "world_size")? {
            return Err(new_error::<InvalidLayoutError>(
                py,
                "a pickled placed MeshLayout's world_size differs from its placement's; the pickle is corrupted"
                    .into(),
                "state",
                state.get_item(0)?,
            ));
        }
        w
    } else {
        PyMeshLayout::world(py, &state.get_item(0)?, rank_map)?
    };
    let axes = axes_arg(py, &state.get_item(2)?)?;
    let names = names_arg(py, &state.get_item(3)?, "names")?;
    let root = match state.len() {
        5 | 6 => Some(names_arg(py, &state.get_item(4)?, "root_names")?),
        _ => None,
    };
    let w: Arc<World> = world.inner.world_arc().clone();
    guarded(py, || {
        let layout = Layout::from_raw_parts(w, &axes, &names)?;
        match &root {
            Some(root) => layout.with_root_names(root),
            None => Ok(layout),
        }
    })
    .map(PyMeshLayout::wrap)
}

/// torch's hashed name of a member-only process group (`distributed_c10d._hash_ranks_to_str`):
/// the SHA-1 hex digest of `"_".join(map(str, ranks)) + "_" + str(salt)`, computed without
/// building the joined string (O(members), GIL released; see [`crate::hashes::group_name_hash`]).
/// `ranks` is the sorted member list as an int32 array. rankmesh's start-up self-check compares
/// it with torch's own function.
#[pyfunction]
fn hashed_group_name(
    py: Python<'_>,
    ranks: PyReadonlyArray1<'_, i32>,
    salt: u64,
) -> PyResult<String> {
    let ranks = ranks.as_slice()?;
    Ok(py.detach(|| crate::hashes::group_name_hash(ranks, salt)))
}

/// The members of a group (an int32 array) as a tuple of ints that Python's cycle collector does
/// not track. A tuple of ints can hold no reference cycle, and CPython untracks such a tuple itself
/// at the first collection that sees it, after walking it three times; a rank table's members
/// (thousands of ranks per group) are made in a process's first mesh build, whose allocations set
/// off that collection, so they are handed over untracked.
#[pyfunction]
fn member_tuple<'py>(
    py: Python<'py>,
    ranks: PyReadonlyArray1<'py, i32>,
) -> PyResult<Bound<'py, PyTuple>> {
    let members = PyTuple::new(py, ranks.as_array().iter().copied())?;
    // SAFETY: `members` is a live tuple this function just made, and it holds ints only (no
    // references a cycle could run through), which is when CPython untracks a tuple itself.
    unsafe { pyo3::ffi::PyObject_GC_UnTrack(members.as_ptr().cast()) };
    Ok(members)
}

/// A set of distinct ranks as one value: `offset + sum(digit_k(i) * stride_k)` over `(size,
/// stride)` modes (see `rankmesh.Slice`'s docs), validated once; every query a method.
#[pyclass(module = "rankmesh", name = "Slice", frozen, eq, hash)]
#[derive(PartialEq, Eq, Hash)]
pub struct PySlice {
    inner: Slice,
}

/// `other` as a Slice, or `ArgumentTypeError` naming `other`.
fn slice_arg<'a, 'py>(py: Python<'py>, other: &'a Bound<'py, PyAny>) -> PyResult<&'a Slice> {
    match other.cast::<PySlice>() {
        Ok(s) => Ok(&s.get().inner),
        Err(_) => {
            let message = format!("other must be a rankmesh.Slice, got {}", describe(other));
            Err(type_error(py, message, "other", other))
        }
    }
}

/// A rank argument as a `u64`, or None for one no slice holds (negative or past int32).
fn rank_u64(py: Python<'_>, rank: &Bound<'_, PyAny>, field: &str) -> PyResult<Option<u64>> {
    let r = int_arg(py, rank, field)?;
    Ok((0..=crate::error::MAX_WORLD_SIZE as i128)
        .contains(&r)
        .then_some(r as u64))
}

#[pymethods]
impl PySlice {
    /// The ranks `offset + sum(digit_k * stride_k)` for `modes` `[(size, stride), ...]`
    /// (outermost first).
    #[new]
    #[pyo3(signature = (offset, modes = None))]
    fn new(
        py: Python<'_>,
        offset: &Bound<'_, PyAny>,
        modes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let off = int_arg(py, offset, "offset")?;
        let modes = match modes {
            None => Vec::new(),
            Some(m) => modes_arg(py, m)?,
        };
        guarded(py, || Slice::new(off, &modes)).map(|inner| PySlice { inner })
    }

    /// The ranks of a Python `range` with a positive step and at least one rank.
    #[staticmethod]
    fn of_range(py: Python<'_>, ranks: &Bound<'_, PyAny>) -> PyResult<Self> {
        let Ok(r) = ranks.cast::<pyo3::types::PyRange>() else {
            let message = format!("ranks must be a range, got {}", describe(ranks));
            return Err(type_error(py, message, "ranks", ranks));
        };
        use pyo3::types::PyRangeMethods;
        let (start, step, len) = (r.start()? as i128, r.step()? as i128, ranks.len()? as i128);
        if len < 1 || (step < 1 && len > 1) {
            let message = format!(
                "ranks must be a non-empty range with a positive step, got {}",
                describe(ranks)
            );
            return Err(new_error::<InvalidLayoutError>(py, message, "ranks", ranks));
        }
        guarded(py, || Slice::range(start, len, step)).map(|inner| PySlice { inner })
    }

    /// The slice that `ranks` (1-D, int64) are in their order, or None when they are no such set
    /// (a general subset, a repeated rank, a negative rank). O(len), in the core.
    #[staticmethod]
    fn recognise(py: Python<'_>, ranks: PyReadonlyArray1<'_, i64>) -> PyResult<Option<Self>> {
        let ranks = ranks.as_slice()?;
        Ok(py
            .detach(|| Slice::recognise(ranks))
            .map(|inner| PySlice { inner }))
    }

    #[getter]
    fn offset(&self) -> u64 {
        self.inner.offset()
    }

    /// `[(size, stride), ...]`, outermost first, coalesced (none for one rank).
    #[getter]
    fn modes(&self) -> Vec<(u64, u64)> {
        self.inner
            .modes()
            .iter()
            .map(|m| (m.size, m.stride))
            .collect()
    }

    /// The largest rank.
    #[getter]
    fn last(&self) -> u64 {
        self.inner.last()
    }

    fn __len__(&self) -> usize {
        self.inner.len() as usize
    }

    fn __contains__(&self, py: Python<'_>, rank: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(rank_u64(py, rank, "rank")?.is_some_and(|r| self.inner.contains(r)))
    }

    /// The rank at `index` (`select`); `IndexError` outside `0..len`.
    fn rank_at(&self, py: Python<'_>, index: &Bound<'_, PyAny>) -> PyResult<u64> {
        let i = int_arg(py, index, "index")?;
        if i < 0 || i >= self.inner.len() as i128 {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "index = {i} is out of range for a slice of {} ranks",
                self.inner.len()
            )));
        }
        Ok(self.inner.rank_at(i as u64))
    }

    /// The index of `rank`, or None when it is not one of the ranks. O(modes).
    fn index_of(&self, py: Python<'_>, rank: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        Ok(rank_u64(py, rank, "rank")?.and_then(|r| self.inner.index_of(r)))
    }

    /// `rank`'s digit in each mode (outermost first), or None when it is not one of the ranks.
    fn coordinates(&self, py: Python<'_>, rank: &Bound<'_, PyAny>) -> PyResult<Option<Vec<u64>>> {
        Ok(rank_u64(py, rank, "rank")?.and_then(|r| self.inner.coordinates(r)))
    }

    /// `range(start, stop, step)` when the ranks are one, else None.
    fn as_range<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        match self.inner.as_range() {
            None => Ok(None),
            Some((start, len, step)) => {
                let r = pyo3::types::PyRange::new_with_step(
                    py,
                    start as isize,
                    (start + len * step) as isize,
                    step as isize,
                )?;
                Ok(Some(r.into_any()))
            }
        }
    }

    /// Every rank, in index order (int32 numpy array, O(len)).
    fn ranks<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        let ranks = py.detach(|| {
            self.inner
                .ranks()
                .into_iter()
                .map(|r| r as i32)
                .collect::<Vec<_>>()
        });
        PyArray1::from_vec(py, ranks)
    }

    /// The least rank in both slices, or None: O(log stride) for two ranges, else the smaller
    /// slice walked in increasing order.
    fn first_shared_rank(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        let other = slice_arg(py, other)?;
        Ok(py.detach(|| self.inner.first_shared_rank(other)))
    }

    /// Whether the slices share a rank.
    fn intersects(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        let other = slice_arg(py, other)?;
        Ok(py.detach(|| self.inner.intersects(other)))
    }

    /// Whether every rank of this slice is one of `other`'s, from the modes alone (O(modes));
    /// None when they do not decide it (an offset, or cut points that are no divisibility chain).
    fn subset_by_modes(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Option<bool>> {
        Ok(self.inner.subset_by_modes(slice_arg(py, other)?))
    }

    fn __repr__(&self) -> String {
        let modes: Vec<String> = self
            .inner
            .modes()
            .iter()
            .map(|m| format!("({}, {})", m.size, m.stride))
            .collect();
        format!("Slice({}, [{}])", self.inner.offset(), modes.join(", "))
    }
}

/// Test hook: panics inside the guard, to prove a panic reaches Python as InternalError.
#[pyfunction]
fn _panic_for_test(py: Python<'_>) -> PyResult<()> {
    guarded(py, || -> Result<(), LayoutError> {
        panic!("deliberate panic for the FFI test")
    })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyMeshLayout>()?;
    m.add_class::<PySlice>()?;
    m.add_function(wrap_pyfunction!(_restore, m)?)?;
    m.add_function(wrap_pyfunction!(hashed_group_name, m)?)?;
    m.add_function(wrap_pyfunction!(member_tuple, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)?;
    m.add("MAX_WORLD_SIZE", crate::error::MAX_WORLD_SIZE)?;
    // the one version: Cargo.toml's, which maturin also gives the Python package
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // rust-numpy loads numpy's C API on the first array it makes (an import and a version parse
    // of numpy, ~0.3 ms): make one here, with the module, so a process's first mesh build does
    // not pay it (its array-returning methods run on every build).
    PyArray1::<i32>::from_vec(m.py(), Vec::new());
    Ok(())
}
