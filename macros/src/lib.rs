//! The `#[distributed_lock]` attribute for [distlock](https://docs.rs/distlock), re-exported
//! as `distlock::distributed_lock` under distlock's `macros` feature. Its documentation lives
//! there.
//!
//! Layout follows tracing-attributes: this file is the entry point, `attr.rs` parses the
//! arguments, `expand.rs` generates the code.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod attr;
mod expand;

use proc_macro::TokenStream;
use quote::quote;

/// Runs an `async fn` while holding a distributed lock named by its arguments.
///
/// See `distlock::distributed_lock` for the options and examples.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let original = proc_macro2::TokenStream::from(item.clone());
    let result = syn::parse::<attr::Args>(args).and_then(|args| {
        let item = syn::parse::<syn::ItemFn>(item).map_err(|e| {
            syn::Error::new(
                e.span(),
                "#[distributed_lock] goes on an `async fn` (a free function or a method)",
            )
        })?;
        expand::expand(args, item)
    });
    match result {
        Ok(tokens) => tokens.into(),
        // Keep the item, so the rest of the crate (and the IDE) still sees the function.
        Err(e) => {
            let error = e.to_compile_error();
            quote!(#error #original).into()
        }
    }
}
