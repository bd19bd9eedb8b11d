//! Element types of arrays ([`Element`]: Rust numbers with a dtype) and arrays copied to and
//! from `ndarray` arrays ([`ArrayData::from_ndarray`], [`ArrayData::to_ndarray`]); the engine's
//! `serde_tree` maps `ndarray` fields through them.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::ArrayData;
use bytes::Bytes;

/// Element types that map to a treepack dtype (for ndarray conversion).
pub trait Element: Copy + 'static {
    /// The dtype arrays of this element type are stored as.
    const DTYPE: DType;
    /// Size of one element in canonical bytes (the dtype's item size).
    const SIZE: usize;
    /// Append the element's canonical (little-endian) bytes to `out`.
    fn write_le(&self, out: &mut Vec<u8>);
    /// Read one element from its canonical bytes; `b` is exactly `SIZE` bytes long.
    fn read_le(b: &[u8]) -> Self;
}

macro_rules! element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            const SIZE: usize = std::mem::size_of::<$t>();
            fn write_le(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(b: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                <$t>::from_le_bytes(a)
            }
        }
    };
}
element!(i8, DType::I8);
element!(i16, DType::I16);
element!(i32, DType::I32);
element!(i64, DType::I64);
element!(u8, DType::U8);
element!(u16, DType::U16);
element!(u32, DType::U32);
element!(u64, DType::U64);
element!(f32, DType::F32);
element!(f64, DType::F64);
element!(half::f16, DType::F16);
element!(half::bf16, DType::BF16);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    const SIZE: usize = 1;
    fn write_le(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
    }
    fn read_le(b: &[u8]) -> Self {
        b[0] != 0
    }
}

impl ArrayData {
    /// Canonical copy of an ndarray (any memory layout).
    pub fn from_ndarray<T: Element, S: ndarray::Data<Elem = T>, D: ndarray::Dimension>(
        a: &ndarray::ArrayBase<S, D>,
    ) -> ArrayData {
        let mut out = Vec::with_capacity(a.len() * T::SIZE);
        for x in a.iter() {
            x.write_le(&mut out);
        }
        let shape = a.shape().iter().map(|&d| d as u64).collect();
        // Length is itemsize × element count by construction.
        ArrayData::new_unchecked(T::DTYPE, shape, Bytes::from(out))
    }

    /// Convert to an ndarray of element type `T`.
    ///
    /// # Errors
    /// [`Error::Serde`] if the dtype is not `T`'s.
    pub fn to_ndarray<T: Element>(&self) -> Result<ndarray::ArrayD<T>> {
        if *self.dtype() != T::DTYPE {
            return Err(Error::Serde(format!(
                "array has dtype {}, expected {}",
                self.dtype().display(),
                T::DTYPE.display()
            )));
        }
        let v: Vec<T> = self.bytes().chunks_exact(T::SIZE).map(T::read_le).collect();
        let shape: Vec<usize> = self.shape().iter().map(|&d| d as usize).collect();
        ndarray::ArrayD::from_shape_vec(shape, v).map_err(|e| Error::Serde(e.to_string()))
    }
}
