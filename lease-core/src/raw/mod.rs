//! What only backend authors need: store URLs (strict percent-decoding, the password of a
//! URL, redaction, the userinfo check), TLS (loaded PEM files, what a failed handshake
//! means), a look into an error's causes, the caller's deadline for a call (so that a
//! call is not bounded by two timers), and a list of connections kept between calls.
//! Applications need none of it: the crate root exports what they use ([`TlsFiles`](crate::TlsFiles) among it).
//!
//! Every backend in this workspace uses these, so that a URL, a TLS file or a refused
//! handshake is read and reported the same way on every store. A backend's
//! [`Capabilities`](crate::Capabilities) are built with
//! [`Capabilities::new`](crate::Capabilities::new) and its `with_*` setters.

pub mod deadline;
pub mod errors;
pub mod idle;
pub mod tls;
pub mod url;

pub use crate::heartbeat::RENEW_CALLS_IN_FLIGHT;
