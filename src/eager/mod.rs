//! An eager tensor front end: [`Array`]s with `matmul`, `add`, `relu`, ... that return at
//! once while the VM runs the work asynchronously, the way a deep-learning framework
//! drives its runtime.
//!
//! A [`Context`] turns each call into a checked op call on the compute stream of the
//! array's device; [`Array::to`] copies through the device's host-to-device and
//! device-to-host streams, so copies overlap compute. Bad calls (shapes, dtypes, devices,
//! released arrays) are refused at the call with the typed [`Error`](crate::Error) the
//! [`InstructionsBuilder`](crate::framework::InstructionsBuilder) gives; failures at run
//! time (a failed kernel) travel with the arrays they poison and come back from
//! [`Array::to_vec`] and [`Array::wait`].
//!
//! Arrays and contexts are owned, counted handles (`Clone + Send + Sync`): an array keeps
//! its context and its VM running, so a model keeps its weights in a struct beside its VM,
//! and the VM shuts down when the last of the `VirtualMachine`, its contexts and their
//! arrays drops. Calls are built into one builder the context keeps open and handed to the
//! VM in batches, at most [`ContextOptions::flush_every`] calls apart and before every read
//! or wait (`docs/frontend.md` says when, why, and what it costs).
//!
//! ```
//! use eagervm::eager::Context;
//! use eagervm::ep::mock::MockConfig;
//! use eagervm::prelude::*;
//!
//! let vm = VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default()))?;
//! let cx = Context::new(&vm);
//! let gpu = DeviceId::mock(0);
//! let x = cx.from_slice(&[1.0f32, -2.0, 3.0, -4.0], &[2, 2], DeviceId::CPU)?.to(gpu)?;
//! let b = cx.from_slice(&[10.0f32, 20.0], &[2], gpu)?;
//! let y = x.add_bias(&b)?.relu()?.sum_rows()?; // [11 + 13, 18 + 16]
//! assert_eq!(y.to(DeviceId::CPU)?.to_vec::<f32>()?, vec![24.0, 34.0]);
//! # Ok::<(), eagervm::Error>(())
//! ```

mod advanced;
mod array;
mod context;
mod index;
pub(crate) mod layout;
mod math;
mod nn;
mod pad;
mod pointwise;
mod products;
pub(crate) mod promote;
mod reduce;
mod select;
mod views;

pub use advanced::Indexer;
pub use array::Array;
pub use context::{Context, ContextOptions, ContextStats};
pub use index::TensorIndex;
#[cfg(feature = "python")]
pub(crate) use math::Bin;
pub use math::Rhs;
pub use nn::{Conv2dOptions, Padding, PoolOptions};
pub use pad::PadMode;
pub use pointwise::{where_of, RoundingMode};
pub use promote::DEFAULT_FLOAT;
pub use reduce::{Reduction, DEFAULT_IGNORE_INDEX};
pub use select::{cat, embedding, stack, ScatterReduce};
