//! The methods of `eagervm.Array` (`python::array`), with PyTorch's names, arguments and
//! semantics (`docs/python.md`).
//!
//! Each method here is a thin one: it converts its arguments (`python::args`,
//! `python::dtype`) and calls the eager array's method, the one place where a call is
//! checked and built; views and indexing are in `python::views`, arithmetic, comparisons
//! and index assignment in `python::ops`, values to and from Python in `python::interop`.
//! Every op returns at once; reads (`numpy`, `item`, `tolist`, `repr`) and `wait` wait
//! with the GIL released (`python::issue`).

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::types::PyTuple;

use super::array::PyArr;
use super::convert;
use super::dtype::{dtype_object, PyDType, PyDevice};
use super::errors::IntoPy;
use super::interop::{item, to_ndarray};
use super::issue::{access, issued};
use super::ops;
use super::views;
use crate::eager::Bin;
use crate::ep::{DeviceId, DeviceType};
use crate::framework::virtual_machine::HostAccess;
use crate::framework::DType;

#[pymethods]
impl PyArr {
    // ---- Metadata (read without waiting).

    /// Dimension sizes, a tuple.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.a.shape())
    }

    /// The size of dimension `dim`, or every size (the shape) without it.
    #[pyo3(signature = (dim=None))]
    fn size<'py>(&self, py: Python<'py>, dim: Option<isize>) -> PyResult<Bound<'py, PyAny>> {
        views::per_dim(py, "size", self.a.shape(), dim)
    }

    /// Elements of the storage between neighbours along dimension `dim`, or along each.
    #[pyo3(signature = (dim=None))]
    fn stride<'py>(&self, py: Python<'py>, dim: Option<isize>) -> PyResult<Bound<'py, PyAny>> {
        views::per_dim(py, "stride", self.a.strides(), dim)
    }

    /// The storage element of index `[0, 0, ...]`.
    fn storage_offset(&self) -> usize {
        self.a.storage_offset()
    }

    /// Whether the elements lie in row-major order one after another.
    fn is_contiguous(&self) -> bool {
        self.a.is_contiguous()
    }

    /// Number of dimensions.
    fn dim(&self) -> usize {
        self.a.ndim()
    }

    /// Number of dimensions.
    #[getter]
    fn ndim(&self) -> usize {
        self.a.ndim()
    }

    /// Number of elements.
    fn numel(&self) -> usize {
        self.a.numel()
    }

    /// The dtype (`eagervm.float32`, ...; equal to NumPy's of the same name).
    #[getter]
    fn dtype<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDType>> {
        dtype_object(py, self.a.dtype())
    }

    /// Where the array lives (`eagervm.device`; equal to its string, `"cpu:0"`, ...).
    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice { d: self.a.device() }
    }

    /// Whether the array is on a CUDA device.
    #[getter]
    fn is_cuda(&self) -> bool {
        self.a.device().ty == DeviceType::Cuda
    }

    /// Bytes per element.
    fn element_size(&self) -> usize {
        self.a.dtype().size()
    }

    /// Bytes per element.
    #[getter]
    fn itemsize(&self) -> usize {
        self.a.dtype().size()
    }

    /// Bytes of the elements.
    #[getter]
    fn nbytes(&self) -> usize {
        self.a.numel() * self.a.dtype().size()
    }

    /// Whether the dtype is a floating-point type.
    fn is_floating_point(&self) -> bool {
        self.a.dtype().is_floating()
    }

    /// The tensor's id in its VM (errors and traces name tensors by it).
    #[getter]
    fn id(&self) -> u64 {
        self.a.id()
    }

    // ---- Views.

    /// Every dimension in reverse order (a view).
    #[getter(T)]
    fn reversed(&self, py: Python<'_>) -> PyResult<PyArr> {
        Ok(PyArr { a: issued(py, self.a.context(), self.a.reversed_dims())? })
    }

    /// The last two dimensions swapped (a view).
    #[getter(mT)]
    fn m_t(&self, py: Python<'_>) -> PyResult<PyArr> {
        Ok(PyArr { a: issued(py, self.a.context(), self.a.mt())? })
    }

    /// The same elements in another shape (one size may be -1), without a copy.
    #[pyo3(signature = (*shape))]
    fn view(&self, py: Python<'_>, shape: &Bound<'_, PyTuple>) -> PyResult<PyArr> {
        views::view(py, self, shape)
    }

    /// The elements in another shape: a view where the strides allow one, else a copy.
    #[pyo3(signature = (*shape))]
    fn reshape(&self, py: Python<'_>, shape: &Bound<'_, PyTuple>) -> PyResult<PyArr> {
        views::reshape(py, self, shape)
    }

    /// Dimensions `dim0` and `dim1` swapped (a view).
    fn transpose(&self, py: Python<'_>, dim0: isize, dim1: isize) -> PyResult<PyArr> {
        views::transpose(py, self, dim0, dim1)
    }

    /// Dimension `i` of the result is dimension `dims[i]` (a view).
    #[pyo3(signature = (*dims))]
    fn permute(&self, py: Python<'_>, dims: &Bound<'_, PyTuple>) -> PyResult<PyArr> {
        views::permute(py, self, dims)
    }

    /// The transpose of a matrix (a view; at most two dimensions).
    fn t(&self, py: Python<'_>) -> PyResult<PyArr> {
        Ok(PyArr { a: issued(py, self.a.context(), self.a.t())? })
    }

    /// Size-1 dimensions repeated (stride 0) and new leading ones added; -1 keeps a size.
    #[pyo3(signature = (*sizes))]
    fn expand(&self, py: Python<'_>, sizes: &Bound<'_, PyTuple>) -> PyResult<PyArr> {
        views::expand(py, self, sizes)
    }

    /// This array expanded to `other`'s shape.
    fn expand_as(&self, py: Python<'_>, other: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        Ok(PyArr { a: issued(py, self.a.context(), self.a.expand_as(&other.a))? })
    }

    /// This array expanded to `size`.
    fn broadcast_to(&self, py: Python<'_>, size: &Bound<'_, PyAny>) -> PyResult<PyArr> {
        views::broadcast_to(py, self, size)
    }

    /// Size-1 dimensions removed: all, or those of `dim` (an int or a tuple).
    #[pyo3(signature = (dim=None))]
    fn squeeze(&self, py: Python<'_>, dim: Option<&Bound<'_, PyAny>>) -> PyResult<PyArr> {
        views::squeeze(py, self, dim)
    }

    /// A size-1 dimension inserted at `dim`.
    fn unsqueeze(&self, py: Python<'_>, dim: isize) -> PyResult<PyArr> {
        views::unsqueeze(py, self, dim)
    }

    /// Dimensions `start_dim..=end_dim` merged (a view where the strides allow it).
    #[pyo3(signature = (start_dim=0, end_dim=-1))]
    fn flatten(&self, py: Python<'_>, start_dim: isize, end_dim: isize) -> PyResult<PyArr> {
        views::flatten(py, self, start_dim, end_dim)
    }

    /// Dimension `dim` split into `sizes` (one may be -1).
    fn unflatten(&self, py: Python<'_>, dim: isize, sizes: &Bound<'_, PyAny>) -> PyResult<PyArr> {
        views::unflatten(py, self, dim, sizes)
    }

    /// Elements `start..start + length` of dimension `dim`.
    fn narrow(&self, py: Python<'_>, dim: isize, start: isize, length: i64) -> PyResult<PyArr> {
        views::narrow(py, self, dim, start, length)
    }

    /// Element `index` of dimension `dim`, the dimension removed.
    fn select(&self, py: Python<'_>, dim: isize, index: isize) -> PyResult<PyArr> {
        views::select(py, self, dim, index)
    }

    /// Dimension `dim` cut into pieces: of `split_size_or_sections` elements (an int), or
    /// of the sizes given (a sequence). A tuple of views.
    #[pyo3(signature = (split_size_or_sections, dim=0))]
    fn split<'py>(
        &self,
        py: Python<'py>,
        split_size_or_sections: &Bound<'py, PyAny>,
        dim: isize,
    ) -> PyResult<Bound<'py, PyTuple>> {
        views::split(py, self, split_size_or_sections, dim)
    }

    /// Dimension `dim` cut into at most `chunks` equal pieces (a tuple of views).
    #[pyo3(signature = (chunks, dim=0))]
    fn chunk<'py>(&self, py: Python<'py>, chunks: i64, dim: isize) -> PyResult<Bound<'py, PyTuple>> {
        views::chunk(py, self, chunks, dim)
    }

    /// Every element of dimension `dim`, the dimension removed (a tuple of views).
    #[pyo3(signature = (dim=0))]
    fn unbind<'py>(&self, py: Python<'py>, dim: isize) -> PyResult<Bound<'py, PyTuple>> {
        views::unbind(py, self, dim)
    }

    /// The diagonal of dimensions `dim1` and `dim2`, shifted by `offset`, as a last
    /// dimension (a view).
    #[pyo3(signature = (offset=0, dim1=0, dim2=1))]
    fn diagonal(&self, py: Python<'_>, offset: isize, dim1: isize, dim2: isize) -> PyResult<PyArr> {
        views::diagonal(py, self, offset, dim1, dim2)
    }

    /// A view of the storage: `size` and `stride` from element `storage_offset` (this
    /// array's own offset if not given).
    #[pyo3(signature = (size, stride, storage_offset=None))]
    fn as_strided(
        &self,
        py: Python<'_>,
        size: &Bound<'_, PyAny>,
        stride: &Bound<'_, PyAny>,
        storage_offset: Option<i64>,
    ) -> PyResult<PyArr> {
        views::as_strided(py, self, size, stride, storage_offset)
    }

    /// This array if it is contiguous, else a contiguous copy.
    fn contiguous(slf: &Bound<'_, Self>) -> PyResult<Py<PyArr>> {
        let me = slf.get();
        if me.a.is_contiguous() {
            return Ok(slf.clone().unbind());
        }
        Py::new(slf.py(), PyArr { a: issued(slf.py(), me.a.context(), me.a.contiguous())? })
    }

    /// A copy of the values, contiguous (`clone` of PyTorch).
    fn clone(&self, py: Python<'_>) -> PyResult<PyArr> {
        Ok(PyArr { a: issued(py, self.a.context(), self.a.copy())? })
    }

    /// `x[key]`: integers, slices (with steps), `None`, `...` and tuples of them; a view.
    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<PyArr> {
        views::get_item(py, self, key)
    }

    /// `x[key] = value`: written through the view `x[key]` (broadcast, converted).
    fn __setitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        ops::set_item(py, self, key, value)
    }

    /// The views of dimension 0, in order.
    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if self.a.ndim() == 0 {
            return Err(PyTypeError::new_err("iteration over a 0-d array"));
        }
        Ok(views::unbind(py, self, 0)?.into_any().try_iter()?.into_any())
    }

    /// The size of dimension 0.
    fn __len__(&self) -> PyResult<usize> {
        match self.a.shape().first() {
            Some(&n) => Ok(n),
            None => Err(PyTypeError::new_err("len() of a 0-d array")),
        }
    }

    // ---- Copies and conversions.

    /// This array moved and converted, as PyTorch's `to`: `to(device)`, `to(dtype)`,
    /// `to(device, dtype)`, `to(other)` (its device and dtype), or by keyword; itself if
    /// nothing changes (unless `copy=True`). Every copy is asynchronous (`non_blocking` is
    /// taken and has no effect).
    #[pyo3(signature = (*args, device=None, dtype=None, non_blocking=false, copy=false))]
    fn to(
        slf: &Bound<'_, Self>,
        args: &Bound<'_, PyTuple>,
        device: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
        non_blocking: bool,
        copy: bool,
    ) -> PyResult<Py<PyArr>> {
        let _ = non_blocking;
        convert::to(slf, args, device, dtype, copy)
    }

    /// A copy on the host (`to("cpu")`); itself if it is there.
    fn cpu(slf: &Bound<'_, Self>) -> PyResult<Py<PyArr>> {
        convert::moved(slf, Some(DeviceId::CPU), None, false)
    }

    /// A copy on CUDA device `device` (default 0); itself if it is there.
    #[pyo3(signature = (device=None))]
    fn cuda(slf: &Bound<'_, Self>, device: Option<&Bound<'_, PyAny>>) -> PyResult<Py<PyArr>> {
        let d = super::dtype::opt_device(device)?.unwrap_or(DeviceId::cuda(0));
        convert::moved(slf, Some(d), None, false)
    }

    /// `to(eagervm.float32)`.
    fn float(slf: &Bound<'_, Self>) -> PyResult<Py<PyArr>> {
        convert::cast(slf, DType::F32)
    }
    /// `to(eagervm.float64)`.
    fn double(slf: &Bound<'_, Self>) -> PyResult<Py<PyArr>> {
        convert::cast(slf, DType::F64)
    }
    /// `to(eagervm.float16)`.
    fn half(slf: &Bound<'_, Self>) -> PyResult<Py<PyArr>> {
        convert::cast(slf, DType::F16)
    }
    /// `to(eagervm.bfloat16)`.
    fn bfloat16(slf: &Bound<'_, Self>) -> PyResult<Py<PyArr>> {
        convert::cast(slf, DType::BF16)
    }
    /// `to(eagervm.int32)`.
    fn int(slf: &Bound<'_, Self>) -> PyResult<Py<PyArr>> {
        convert::cast(slf, DType::I32)
    }
    /// `to(eagervm.int64)`.
    fn long(slf: &Bound<'_, Self>) -> PyResult<Py<PyArr>> {
        convert::cast(slf, DType::I64)
    }
    /// `to(eagervm.bool)`.
    fn bool(slf: &Bound<'_, Self>) -> PyResult<Py<PyArr>> {
        convert::cast(slf, DType::Bool)
    }
    /// `to(eagervm.uint8)`.
    fn byte(slf: &Bound<'_, Self>) -> PyResult<Py<PyArr>> {
        convert::cast(slf, DType::U8)
    }

    // ---- Reads (wait for the value; raise the error the array carries).

    /// The values as a new NumPy array of the same dtype (a copy; `bfloat16` needs
    /// `ml_dtypes`).
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_ndarray(py, &self.a)
    }

    /// The values as nested lists of Python numbers (a number for a 0-d array).
    fn tolist<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        views::tolist(py, &self.a)
    }

    /// The one element of a one-element array, as a Python number.
    fn item(&self, py: Python<'_>) -> PyResult<PyObject> {
        item(py, &self.a)
    }

    /// `numpy.asarray(array)`: a copy, or with `copy=False` a view of the VM's storage, as
    /// `numpy.from_dlpack` makes (`docs/python.md`, "DLPack").
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        slf: &Bound<'py, Self>,
        py: Python<'py>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if copy == Some(false) {
            if !slf.get().a.device().is_host() {
                return Err(PyValueError::new_err(format!(
                    "the array is on {}: NumPy can only view host memory; copy it with .to(\"cpu\")",
                    slf.get().a.device()
                )));
            }
            let a = py.import("numpy")?.getattr("from_dlpack")?.call1((slf,))?;
            return match dtype {
                Some(d) if !a.getattr("dtype")?.eq(d)? => {
                    Err(PyValueError::new_err("a view cannot change the dtype; pass copy=None or copy=True"))
                }
                _ => Ok(a),
            };
        }
        let a = slf.get().numpy(py)?;
        match dtype {
            Some(d) if !a.getattr("dtype")?.eq(d)? => a.call_method1("astype", (d,)),
            _ => Ok(a),
        }
    }

    /// NumPy's operators and ufuncs leave eagervm arrays to eagervm's own operators
    /// (`np.float32(2) * x` is an eagervm array; `ndarray + x` a `TypeError`).
    #[classattr]
    fn __array_ufunc__(py: Python<'_>) -> PyObject {
        py.None()
    }

    /// The value of a one-element array, as PyTorch's `bool(t)`.
    fn __bool__(&self, py: Python<'_>) -> PyResult<bool> {
        convert::only_value(py, &self.a, "the truth value")?.bind(py).is_truthy()
    }

    fn __int__(&self, py: Python<'_>) -> PyResult<PyObject> {
        let v = convert::only_value(py, &self.a, "int()")?;
        Ok(py.get_type::<pyo3::types::PyInt>().call1((v,))?.unbind())
    }

    fn __float__(&self, py: Python<'_>) -> PyResult<f64> {
        convert::only_value(py, &self.a, "float()")?.extract(py)
    }

    /// `tensor([...], device='mock:0', dtype=eagervm.float16)`, as PyTorch prints (the
    /// values as NumPy formats them; `python/eagervm/_format.py`). Waits for the values.
    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        slf.py().import("eagervm._format")?.call_method1("tensor_repr", (slf,))?.extract()
    }

    /// A 0-d array formats as its value (`f"{loss:.3f}"`), others as `repr`.
    fn __format__(slf: &Bound<'_, Self>, spec: &str) -> PyResult<String> {
        let me = slf.get();
        if me.a.ndim() == 0 {
            return item(slf.py(), &me.a)?.bind(slf.py()).call_method1("__format__", (spec,))?.extract();
        }
        if spec.is_empty() {
            return Self::__repr__(slf);
        }
        Err(PyTypeError::new_err(
            "unsupported format string passed to Array.__format__ (only 0-d arrays take one)",
        ))
    }

    /// Hashed by identity, as PyTorch's tensors are (`==` is elementwise).
    fn __hash__(slf: &Bound<'_, Self>) -> isize {
        slf.as_ptr() as isize
    }

    /// Wait until the array is computed; raise the error it carries, if any.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        access(py, &self.a, HostAccess::Wait)?.py_err().map(|_| ())
    }

    /// Free the storage now, after every use already made of it; later uses raise
    /// `ReleasedError`.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        let r = py.allow_threads(|| self.a.release());
        issued(py, self.a.context(), r)
    }

    // ---- Arithmetic and comparisons (`python::ops`).

    fn __add__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        ops::operator(py, self, Bin::Add, other)
    }
    fn __radd__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        ops::reflected(py, self, Bin::Add, other)
    }
    fn __sub__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        ops::operator(py, self, Bin::Sub, other)
    }
    fn __rsub__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        ops::reflected(py, self, Bin::Sub, other)
    }
    fn __mul__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        ops::operator(py, self, Bin::Mul, other)
    }
    fn __rmul__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        ops::reflected(py, self, Bin::Mul, other)
    }
    fn __truediv__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        ops::operator(py, self, Bin::Div, other)
    }
    fn __rtruediv__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        ops::reflected(py, self, Bin::Div, other)
    }
    fn __iadd__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<()> {
        ops::in_place(py, self, Bin::Add, other)
    }
    fn __isub__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<()> {
        ops::in_place(py, self, Bin::Sub, other)
    }
    fn __imul__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<()> {
        ops::in_place(py, self, Bin::Mul, other)
    }
    fn __itruediv__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<()> {
        ops::in_place(py, self, Bin::Div, other)
    }
    fn __richcmp__(&self, py: Python<'_>, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<PyObject> {
        ops::operator(py, self, ops::compare(op), other)
    }
    fn __neg__(&self, py: Python<'_>) -> PyResult<PyArr> {
        Ok(PyArr { a: issued(py, self.a.context(), self.a.neg())? })
    }
    fn __pos__<'py>(slf: &Bound<'py, Self>) -> Bound<'py, Self> {
        slf.clone()
    }
    fn __matmul__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        match other.downcast::<PyArr>() {
            Ok(o) => {
                let a = issued(py, self.a.context(), self.a.matmul(&o.get().a))?;
                Ok(Py::new(py, PyArr { a })?.into_any())
            }
            Err(_) => Ok(py.NotImplemented()),
        }
    }

    /// Elementwise `self + alpha * other` (an array, broadcast, or a number).
    #[pyo3(signature = (other, *, alpha=None))]
    fn add(
        &self,
        py: Python<'_>,
        other: &Bound<'_, PyAny>,
        alpha: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        match alpha {
            None => ops::method(py, self, Bin::Add, other),
            Some(alpha) => super::pointwise::with_alpha(py, self, other, alpha, false),
        }
    }
    /// Elementwise `self - alpha * other`.
    #[pyo3(signature = (other, *, alpha=None))]
    fn sub(
        &self,
        py: Python<'_>,
        other: &Bound<'_, PyAny>,
        alpha: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        match alpha {
            None => ops::method(py, self, Bin::Sub, other),
            Some(alpha) => super::pointwise::with_alpha(py, self, other, alpha, true),
        }
    }
    /// Elementwise `self * other`.
    fn mul(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyArr> {
        ops::method(py, self, Bin::Mul, other)
    }
    /// Elementwise true division (integers divide as floats), or with `rounding_mode`
    /// `"floor"` or `"trunc"` the rounded quotient in the operands' result type.
    #[pyo3(signature = (other, *, rounding_mode=None))]
    fn div(&self, py: Python<'_>, other: &Bound<'_, PyAny>, rounding_mode: Option<&str>) -> PyResult<PyArr> {
        match rounding_mode {
            None => ops::method(py, self, Bin::Div, other),
            Some(mode) => super::pointwise::div_rounded(py, self, other, mode),
        }
    }
    /// `-self`.
    fn neg(&self, py: Python<'_>) -> PyResult<PyArr> {
        self.__neg__(py)
    }
    /// `self == other` elementwise, a bool array.
    fn eq(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyArr> {
        ops::method(py, self, Bin::Eq, other)
    }
    /// `self != other` elementwise.
    fn ne(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyArr> {
        ops::method(py, self, Bin::Ne, other)
    }
    /// `self < other` elementwise.
    fn lt(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyArr> {
        ops::method(py, self, Bin::Lt, other)
    }
    /// `self <= other` elementwise.
    fn le(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyArr> {
        ops::method(py, self, Bin::Le, other)
    }
    /// `self > other` elementwise.
    fn gt(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyArr> {
        ops::method(py, self, Bin::Gt, other)
    }
    /// `self >= other` elementwise.
    fn ge(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyArr> {
        ops::method(py, self, Bin::Ge, other)
    }

    /// `add` in place (through views into the storage they share); returns this array.
    #[pyo3(signature = (other, *, alpha=None))]
    fn add_<'py>(
        slf: &Bound<'py, Self>,
        other: &Bound<'py, PyAny>,
        alpha: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, Self>> {
        match alpha {
            None => ops::in_place(slf.py(), slf.get(), Bin::Add, other)?,
            Some(alpha) => super::pointwise::with_alpha_(slf.py(), slf.get(), other, alpha, false)?,
        }
        Ok(slf.clone())
    }
    /// `sub` in place.
    #[pyo3(signature = (other, *, alpha=None))]
    fn sub_<'py>(
        slf: &Bound<'py, Self>,
        other: &Bound<'py, PyAny>,
        alpha: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, Self>> {
        match alpha {
            None => ops::in_place(slf.py(), slf.get(), Bin::Sub, other)?,
            Some(alpha) => super::pointwise::with_alpha_(slf.py(), slf.get(), other, alpha, true)?,
        }
        Ok(slf.clone())
    }
    /// `mul` in place.
    fn mul_<'py>(slf: &Bound<'py, Self>, other: &Bound<'py, PyAny>) -> PyResult<Bound<'py, Self>> {
        ops::in_place(slf.py(), slf.get(), Bin::Mul, other)?;
        Ok(slf.clone())
    }
    /// `div` in place (refused for an integer array without `rounding_mode`: the result
    /// is floating).
    #[pyo3(signature = (other, *, rounding_mode=None))]
    fn div_<'py>(
        slf: &Bound<'py, Self>,
        other: &Bound<'py, PyAny>,
        rounding_mode: Option<&str>,
    ) -> PyResult<Bound<'py, Self>> {
        match rounding_mode {
            None => ops::in_place(slf.py(), slf.get(), Bin::Div, other)?,
            Some(mode) => super::pointwise::div_rounded_(slf.py(), slf.get(), other, mode)?,
        }
        Ok(slf.clone())
    }

    /// Overwritten with `src` (broadcast to this shape, converted to this dtype, copied
    /// from its device); returns this array.
    fn copy_<'py>(slf: &Bound<'py, Self>, src: PyRef<'py, PyArr>) -> PyResult<Bound<'py, Self>> {
        let me = slf.get();
        let mut a = me.a.clone();
        issued(slf.py(), me.a.context(), a.copy_(&src.a).map(|_| ()))?;
        Ok(slf.clone())
    }

    /// Every element set to `value` (a number, or a 0-d array); returns this array.
    fn fill_<'py>(slf: &Bound<'py, Self>, value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, Self>> {
        let (py, me) = (slf.py(), slf.get());
        let mut a = me.a.clone();
        let r = match value.downcast::<PyArr>() {
            Ok(v) if v.get().a.ndim() == 0 => a.copy_(&v.get().a).map(|_| ()),
            Ok(_) => return Err(PyValueError::new_err("fill_ takes a number or a 0-d array")),
            Err(_) => a.fill_(convert::number("fill_", value)?).map(|_| ()),
        };
        issued(py, me.a.context(), r)?;
        Ok(slf.clone())
    }

    /// Every element set to 0; returns this array.
    fn zero_<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, Self>> {
        let me = slf.get();
        let mut a = me.a.clone();
        issued(slf.py(), me.a.context(), a.zero_().map(|_| ()))?;
        Ok(slf.clone())
    }

    /// This array with `value` where `mask` (a bool array, broadcast) is true.
    fn masked_fill(
        &self,
        py: Python<'_>,
        mask: PyRef<'_, PyArr>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<PyArr> {
        let v = convert::fill_value(py, value)?;
        Ok(PyArr { a: issued(py, self.a.context(), self.a.masked_fill(&mask.a, v))? })
    }

    /// `masked_fill` in place; returns this array.
    fn masked_fill_<'py>(
        slf: &Bound<'py, Self>,
        mask: PyRef<'py, PyArr>,
        value: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, Self>> {
        let (py, me) = (slf.py(), slf.get());
        let v = convert::fill_value(py, value)?;
        let mut a = me.a.clone();
        issued(py, me.a.context(), a.masked_fill_(&mask.a, v).map(|_| ()))?;
        Ok(slf.clone())
    }

    /// `max(self, 0)` elementwise.
    fn relu(&self, py: Python<'_>) -> PyResult<PyArr> {
        Ok(PyArr { a: issued(py, self.a.context(), self.a.relu())? })
    }

    /// `relu` in place; returns this array.
    fn relu_<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, Self>> {
        let me = slf.get();
        let mut a = me.a.clone();
        issued(slf.py(), me.a.context(), a.relu_().map(|_| ()))?;
        Ok(slf.clone())
    }

    /// PyTorch's `matmul`: vectors, matrices and batches whose batch dimensions broadcast
    /// (dtypes promoted).
    fn matmul(&self, py: Python<'_>, other: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        Ok(PyArr { a: issued(py, self.a.context(), self.a.matmul(&other.a))? })
    }

    /// `selfᵀ @ other`: `[k, m], [k, n] -> [m, n]`.
    fn matmul_tn(&self, py: Python<'_>, other: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        Ok(PyArr { a: issued(py, self.a.context(), self.a.matmul_tn(&other.a))? })
    }

    /// `self @ otherᵀ`: `[m, k], [n, k] -> [m, n]`.
    fn matmul_nt(&self, py: Python<'_>, other: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        Ok(PyArr { a: issued(py, self.a.context(), self.a.matmul_nt(&other.a))? })
    }

    /// `self[i][j] + bias[j]`: a `[k]` bias added to every row of `[n, k]`.
    fn add_bias(&self, py: Python<'_>, bias: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        Ok(PyArr { a: issued(py, self.a.context(), self.a.add_bias(&bias.a))? })
    }

    /// `self * factor` (for integers, the factor truncated toward zero).
    fn scale(&self, py: Python<'_>, factor: f64) -> PyResult<PyArr> {
        Ok(PyArr { a: issued(py, self.a.context(), self.a.scale(factor))? })
    }

    /// The gradient of `relu` at `self` given `dy`: `dy` where `self > 0`, else 0.
    fn relu_grad(&self, py: Python<'_>, dy: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        Ok(PyArr { a: issued(py, self.a.context(), self.a.relu_grad(&dy.a))? })
    }

    /// The sum along `dim` (an int, a tuple of ints, or None for every element), keeping
    /// the reduced dimensions with `keepdim`; int64 for bool and integer arrays; `dtype`
    /// converts first (`python::reduce`).
    #[pyo3(signature = (dim=None, keepdim=false, *, dtype=None))]
    fn sum(
        &self,
        py: Python<'_>,
        dim: Option<&Bound<'_, PyAny>>,
        keepdim: bool,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        super::reduce::sum(py, self, dim, keepdim, dtype)
    }

    /// Column sums of `[n, k]`: `[k]`.
    fn sum_rows(&self, py: Python<'_>) -> PyResult<PyArr> {
        Ok(PyArr { a: issued(py, self.a.context(), self.a.sum_rows())? })
    }

    // ---- DLPack (`python::dlpack`).

    /// DLPack export (`docs/python.md`, "DLPack"): the array's own storage, lent to the
    /// consumer until the consumer's deleter runs (`python::dlpack`). On the host, once
    /// every instruction issued so far that writes the array has finished (a view is
    /// exported as it lies, with its strides); on `cuda:N`, at once, with the consumer's
    /// `stream` made to wait on the device for those writes. A host copy for an array on
    /// `mock:N`, with `copy=True`, or with `dl_device=(1, 0)`.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        super::dlpack::export(py, &self.a, stream, max_version, dl_device, copy)
    }

    /// `(2, N)` (DLPack's `kDLCUDA`) for an array on `cuda:N`; `(1, 0)`, the CPU, for every
    /// other array (one on `mock:N` is exported as a host copy).
    fn __dlpack_device__(&self) -> (i32, i32) {
        let d = self.a.device();
        match d.ty {
            DeviceType::Cuda => (super::dlpack::DL_CUDA, i32::from(d.index)),
            _ => (1, 0),
        }
    }
}
