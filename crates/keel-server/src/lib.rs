//! keel's JSON-RPC 2.0 server, over stdio and WebSocket.
//!
//! Both transports carry the same messages and reach the same dispatcher:
//! one JSON-RPC message (or batch) per line on stdio, one per text frame on
//! WebSocket. A [`Connection`] owns the subscriptions its client opened and
//! cancels them when the client goes away.
//!
//! WebSocket clients must present the token from the state directory, either
//! as `Authorization: Bearer <token>` or as a `token` query parameter. Stdio
//! needs none: whoever can write to keel's stdin started the process.

mod connection;
pub mod decode;
mod dispatch;
mod errors;
pub mod stdio;
pub mod ws;

pub use connection::Connection;
pub use errors::to_rpc_error;
