//! The PyO3 edge: `rankmesh._native`. The only module that knows about Python.
//!
//! Every call into the core goes through [`guarded`], which releases the GIL, turns a panic into
//! `rankmesh.errors.InternalError` and maps each [`LayoutError`] to its typed exception class in
//! `rankmesh.errors`. Arrays leave as numpy int32, C-contiguous, built from the Rust `Vec`
//! without copying.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use numpy::{PyArray1, PyArrayDyn, PyArrayMethods, PyReadonlyArray1};
use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

use crate::error::LayoutError;
use crate::layout::{Layout, Mode, World};

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// Builds the Python exception for a core error: `rankmesh.errors.<Kind>(message, field, value)`.
fn to_pyerr(py: Python<'_>, e: &LayoutError) -> PyErr {
    raise(py, e.kind(), e.to_string(), e.field(), e.value())
}

fn raise(py: Python<'_>, kind: &str, message: String, field: String, value: String) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let module =
            ERRORS.get_or_try_init(py, || py.import("rankmesh.errors").map(Bound::unbind))?;
        let cls = module.bind(py).getattr(kind)?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("field", field.clone())?;
        kwargs.set_item("value", value.clone())?;
        Ok(PyErr::from_value(
            cls.call((message.clone(),), Some(&kwargs))?,
        ))
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
            Err(raise(
                py,
                "InternalError",
                format!("internal error in rankmesh's core (please report it): {msg}"),
                String::new(),
                msg,
            ))
        }
    }
}

/// Extracts a Python int (or anything with `__index__`), mapping overflow to a typed error.
fn int_arg(py: Python<'_>, obj: &Bound<'_, PyAny>, field: &str) -> PyResult<i128> {
    match obj.extract::<i128>() {
        Ok(v) => Ok(v),
        Err(e) if e.is_instance_of::<PyOverflowError>(py) => Err(to_pyerr(
            py,
            &LayoutError::Overflow {
                field: field.into(),
                value: obj.str().map(|s| s.to_string()).unwrap_or_default(),
                detail: "the value does not fit a 128-bit integer".into(),
            },
        )),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{field} must be an int, got {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))),
    }
}

/// Converts any 1-D integer sequence or array to a contiguous int64 numpy array.
fn rank_map_arg<'py>(
    py: Python<'py>,
    obj: &Bound<'py, PyAny>,
    world_size: i128,
) -> PyResult<PyReadonlyArray1<'py, i64>> {
    let np = py.import("numpy")?;
    let arr = np.call_method1("asarray", (obj,))?;
    let bad = |detail: String| {
        to_pyerr(
            py,
            &LayoutError::InvalidRankMap {
                world_size: world_size.max(0) as u64,
                detail,
            },
        )
    };
    let kind: String = arr.getattr("dtype")?.getattr("kind")?.extract()?;
    let empty = arr.getattr("size")?.extract::<usize>()? == 0;
    if !(kind == "i" || kind == "u" || empty) {
        let dtype = arr.getattr("dtype")?.str()?.to_string();
        return Err(bad(format!("it must hold integers, got dtype {dtype}")));
    }
    let ndim: usize = arr.getattr("ndim")?.extract()?;
    if ndim != 1 {
        return Err(bad(format!("it must be 1-D, got {ndim} dimensions")));
    }
    let arr = np.call_method1("ascontiguousarray", (arr, "int64"))?;
    Ok(arr.extract()?)
}

fn names_arg(obj: &Bound<'_, PyAny>, field: &str) -> PyResult<Vec<String>> {
    if obj.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(format!(
            "{field} must be a sequence of names, got the string {:?}; wrap it, e.g. ({:?},)",
            obj.to_string(),
            obj.to_string()
        )));
    }
    obj.extract::<Vec<String>>()
        .map_err(|_| PyTypeError::new_err(format!("{field} must be a sequence of str")))
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
        let r = if let Ok(name) = dim.cast::<PyString>() {
            self.inner.dim_by_name(name.to_str()?)
        } else {
            self.inner.dim_index(int_arg(py, dim, "dim")?)
        };
        r.map_err(|e| to_pyerr(py, &e))
    }

    fn wrap(inner: Layout) -> Self {
        PyMeshLayout { inner }
    }
}

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
        let layout = match rank_map {
            None => guarded(py, || Layout::world(size, None))?,
            Some(obj) => {
                let arr = rank_map_arg(py, obj, size)?;
                let slice = arr.as_slice()?;
                guarded(py, || Layout::world(size, Some(slice)))?
            }
        };
        Ok(Self::wrap(layout))
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
        let sizes: Vec<Bound<'_, PyAny>> = sizes
            .try_iter()
            .map_err(|_| PyTypeError::new_err("sizes must be a sequence of int"))?
            .collect::<PyResult<_>>()?;
        let sizes: Vec<i128> = sizes
            .iter()
            .enumerate()
            .map(|(i, s)| int_arg(py, s, &format!("sizes[{i}]")))
            .collect::<PyResult<_>>()?;
        let names = names_arg(names, "names")?;
        let inner = &self.inner;
        guarded(py, || inner.unflatten(d, &sizes, &names)).map(Self::wrap)
    }

    /// Slices by one name or a tuple of names, in mesh order, like `DeviceMesh.__getitem__`.
    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Self> {
        let names: Vec<String> = if let Ok(s) = key.cast::<PyString>() {
            vec![s.to_string()]
        } else if key.is_instance_of::<PyTuple>() || key.is_instance_of::<PyList>() {
            key.extract()?
        } else {
            return Err(PyTypeError::new_err(
                "index a MeshLayout with a dim name or a tuple of names",
            ));
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
        axes: Vec<Vec<(u64, u64)>>,
        names: Vec<String>,
    ) -> PyResult<Self> {
        let modes: Vec<Vec<Mode>> = axes
            .iter()
            .map(|a| a.iter().map(|&(s, d)| Mode::new(s, d)).collect())
            .collect();
        let w: Arc<World> = self.inner.world_arc().clone();
        guarded(py, || Layout::from_parts(w, &modes, &names)).map(Self::wrap)
    }

    /// A 1-D layout over all dims of this one (adjacent or not), like `DeviceMesh._flatten`.
    #[pyo3(signature = (name = None))]
    fn flatten(&self, py: Python<'_>, name: Option<String>) -> PyResult<Self> {
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

    /// The rank map as an int32 array, or None for the identity.
    fn rank_map<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyArray1<i32>>> {
        self.inner
            .world_arc()
            .rank_map()
            .map(|m| PyArray1::from_slice(py, m))
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
        let map = if self.inner.world_arc().rank_map().is_some() {
            ", rank_map=<permutation>"
        } else {
            ""
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
        let args = (
            this.inner.world_size(),
            map,
            axes,
            this.inner.names().to_vec(),
        )
            .into_pyobject(py)?;
        Ok((restore, args))
    }
}

/// Rebuilds a pickled MeshLayout, validating every part.
#[pyfunction]
fn _restore(
    py: Python<'_>,
    world_size: &Bound<'_, PyAny>,
    rank_map: Option<&Bound<'_, PyAny>>,
    axes: Vec<Vec<(u64, u64)>>,
    names: Vec<String>,
) -> PyResult<PyMeshLayout> {
    let world = PyMeshLayout::world(py, world_size, rank_map)?;
    let modes: Vec<Vec<Mode>> = axes
        .iter()
        .map(|a| a.iter().map(|&(s, d)| Mode::new(s, d)).collect())
        .collect();
    let w: Arc<World> = world.inner.world_arc().clone();
    guarded(py, || Layout::from_parts(w, &modes, &names)).map(PyMeshLayout::wrap)
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
    m.add_function(wrap_pyfunction!(_restore, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)?;
    m.add("MAX_WORLD_SIZE", crate::error::MAX_WORLD_SIZE)?;
    Ok(())
}
