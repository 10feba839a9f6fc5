//! Code generation: the function keeps its signature; its body runs inside
//! `distlock::__private::locked`, which takes the lock first and releases it after.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{
    Block, Expr, ExprAsync, FnArg, GenericArgument, ItemFn, Pat, PathArguments, ReturnType, Stmt,
    Type, TypeParamBound,
};

use crate::attr::{placeholders, Args, Mode};

pub(crate) fn expand(args: Args, mut item: ItemFn) -> syn::Result<TokenStream> {
    let names = argument_names(&item);
    placeholders(&args.template, &names)?;

    if item.sig.asyncness.is_some() {
        let ret = result_type(&item.sig.output, &item)?;
        let block = &item.block;
        // The body keeps its own block, so its items (a `use` or a type named like one in the
        // signature) stay out of the return type's scope, and its value is bound with the
        // declared type, so `?` in the body converts errors as it did in the function. The
        // braces of a one-line body would trip `unused_braces` in the user's crate: allowed
        // on this statement only.
        let body = quote!({
            #[allow(unused_braces)]
            let __distlock_out: #ret = #block;
            #[allow(unreachable_code)]
            __distlock_out
        });
        let wrapped = locked(&args, body);
        *item.block = syn::parse_quote!({ #wrapped });
        return Ok(quote!(#item));
    }

    // `#[async_trait]` ran first: the body is `Box::pin(async move { ... })`, the future's
    // output is in the return type. Lock inside that future.
    let not_async_error = not_async(&item);
    if let Some(inner) = async_trait_body(&mut item.block) {
        let ret = async_trait_output(&item.sig.output).ok_or(not_async_error)?;
        check_result(ret)?;
        let block = &inner.block;
        let wrapped = locked(&args, quote!(#block));
        inner.block = syn::parse_quote!({ #wrapped });
        return Ok(quote!(#item));
    }
    Err(not_async_error)
}

/// `locked(client, key, options, async move <body>).await`
fn locked(args: &Args, body: TokenStream) -> TokenStream {
    let krate = args
        .krate
        .as_ref()
        .map_or_else(|| quote!(::distlock), |p| quote!(#p));
    let client = match &args.client {
        Some(expr) => quote_spanned!(expr.span()=> #krate::__private::client_of(&#expr)),
        None => quote!(#krate::__private::default_client()),
    };
    let template = &args.template;
    let millis = |v: Option<u64>| match v {
        Some(ms) => {
            quote!(::core::option::Option::Some(#krate::__private::Duration::from_millis(#ms)))
        }
        None => quote!(::core::option::Option::None),
    };
    let (ttl, timeout) = (millis(args.ttl), millis(args.timeout));
    let (wait, abort) = (args.wait, args.abort_on_lost);
    let mode = match args.mode {
        Mode::Mutex => quote!(#krate::__private::Mode::Mutex),
        Mode::Read => quote!(#krate::__private::Mode::Read),
        Mode::Write => quote!(#krate::__private::Mode::Write),
        Mode::Permits(n) => quote!(#krate::__private::Mode::Permits(#n)),
    };
    quote! {
        let __distlock_client = #client;
        let __distlock_key: ::std::string::String = ::std::format!(#template);
        #krate::__private::locked(
            __distlock_client,
            __distlock_key,
            #krate::__private::Options {
                ttl: #ttl,
                timeout: #timeout,
                wait: #wait,
                abort_on_lost: #abort,
                mode: #mode,
            },
            async move #body,
        )
        .await
    }
}

/// Every name the arguments bind, destructuring included (`Path(id)`, `State(state)`).
fn argument_names(item: &ItemFn) -> Vec<String> {
    let mut names = Vec::new();
    for arg in &item.sig.inputs {
        if let FnArg::Typed(t) = arg {
            bindings(&t.pat, &mut names);
        }
    }
    names
}

fn bindings(pat: &Pat, out: &mut Vec<String>) {
    match pat {
        Pat::Ident(p) => {
            out.push(p.ident.to_string());
            if let Some((_, sub)) = &p.subpat {
                bindings(sub, out);
            }
        }
        Pat::TupleStruct(p) => p.elems.iter().for_each(|e| bindings(e, out)),
        Pat::Tuple(p) => p.elems.iter().for_each(|e| bindings(e, out)),
        Pat::Struct(p) => p.fields.iter().for_each(|f| bindings(&f.pat, out)),
        Pat::Slice(p) => p.elems.iter().for_each(|e| bindings(e, out)),
        Pat::Reference(p) => bindings(&p.pat, out),
        Pat::Type(p) => bindings(&p.pat, out),
        Pat::Paren(p) => bindings(&p.pat, out),
        _ => {}
    }
}

fn not_async(item: &ItemFn) -> syn::Error {
    syn::Error::new(
        item.sig.fn_token.span(),
        "#[distributed_lock] goes on an `async fn`: the lock is awaited before the body runs",
    )
}

fn wrong_return(span: proc_macro2::Span) -> syn::Error {
    syn::Error::new(
        span,
        "#[distributed_lock] needs the function to return `Result<T, E>` with `E: From<distlock::Error>`, so it can report a lock it could not take",
    )
}

/// The declared return type, if it is some `Result<..>`.
fn result_type<'a>(output: &'a ReturnType, item: &ItemFn) -> syn::Result<&'a Type> {
    match output {
        ReturnType::Default => Err(wrong_return(item.sig.ident.span())),
        ReturnType::Type(_, ty) => {
            check_result(ty)?;
            Ok(ty)
        }
    }
}

fn check_result(ty: &Type) -> syn::Result<()> {
    match ty {
        Type::Path(p)
            if p.qself.is_none() && p.path.segments.last().is_some_and(|s| s.ident == "Result") =>
        {
            Ok(())
        }
        Type::Group(g) => check_result(&g.elem),
        Type::Paren(p) => check_result(&p.elem),
        other => Err(wrong_return(other.span())),
    }
}

/// The `async move { .. }` inside a body that is exactly `Box::pin(async move { .. })`.
fn async_trait_body(block: &mut Block) -> Option<&mut ExprAsync> {
    let [Stmt::Expr(Expr::Call(call), None)] = block.stmts.as_mut_slice() else {
        return None;
    };
    let Expr::Path(func) = &*call.func else {
        return None;
    };
    let is_box_pin = {
        let segs: Vec<String> = func
            .path
            .segments
            .iter()
            .map(|s| s.ident.to_string())
            .collect();
        segs.ends_with(&["Box".to_owned(), "pin".to_owned()])
    };
    if !is_box_pin || call.args.len() != 1 {
        return None;
    }
    match call.args.first_mut() {
        Some(Expr::Async(inner)) if inner.capture.is_some() => Some(inner),
        _ => None,
    }
}

/// `R` in `Pin<Box<dyn Future<Output = R> + ..>>`.
fn async_trait_output(output: &ReturnType) -> Option<&Type> {
    let ReturnType::Type(_, ty) = output else {
        return None;
    };
    let pin = last_generic(ty)?;
    let boxed = last_generic(pin)?;
    let Type::TraitObject(object) = boxed else {
        return None;
    };
    object.bounds.iter().find_map(|b| match b {
        TypeParamBound::Trait(t) => {
            let seg = t.path.segments.last()?;
            let PathArguments::AngleBracketed(a) = &seg.arguments else {
                return None;
            };
            a.args.iter().find_map(|arg| match arg {
                GenericArgument::AssocType(assoc) if assoc.ident == "Output" => Some(&assoc.ty),
                _ => None,
            })
        }
        _ => None,
    })
}

/// The single type argument of `Wrapper<T>`.
fn last_generic(ty: &Type) -> Option<&Type> {
    let Type::Path(p) = ty else { return None };
    let PathArguments::AngleBracketed(a) = &p.path.segments.last()?.arguments else {
        return None;
    };
    a.args.iter().find_map(|arg| match arg {
        GenericArgument::Type(t) => Some(t),
        _ => None,
    })
}
