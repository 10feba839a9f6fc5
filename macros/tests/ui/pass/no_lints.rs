// Generated code raises no lint in a user's crate, whatever the form and the body's shape
// (one-line bodies too: `unused_braces` looks at braces on one line).
#![deny(warnings)]

use distlock::{distributed_lock, LockClient};

#[distributed_lock("a")]
async fn mutex() -> Result<(), distlock::Error> { Ok(()) }

#[distributed_lock("b", read)]
async fn read() -> Result<(), distlock::Error> { Ok(()) }

#[distributed_lock("c", write)]
async fn write() -> Result<u8, distlock::Error> { Ok(1) }

#[distributed_lock("d", permits = 2)]
async fn permits() -> Result<(), distlock::Error> { Ok(()) }

#[distributed_lock("e", on_lost = "abort")]
async fn on_lost() -> Result<(), distlock::Error> { Ok(()) }

#[distributed_lock("f", ttl = "5s", timeout = "1s")]
async fn ttl() -> Result<(), distlock::Error> { Ok(()) }

#[distributed_lock("g:{id}", wait = false, client = client)]
async fn with_client(client: &LockClient, id: u32) -> Result<u32, distlock::Error> { Ok(id) }

#[distributed_lock("h")]
async fn statements() -> Result<u32, distlock::Error> {
    let x = 1;
    Ok(x + 1)
}

#[distributed_lock("i")]
async fn early_return(flag: bool) -> Result<(), distlock::Error> {
    if flag {
        return Ok(());
    }
    Ok(())
}

#[distributed_lock("j")]
async fn question_mark() -> std::io::Result<()> {
    LockClient::connect("memory:").await?;
    Ok(())
}

#[distributed_lock("k")]
async fn custom_error() -> Result<(), AppError> { Ok(()) }

#[derive(Debug)]
struct AppError;

impl From<distlock::Error> for AppError {
    fn from(_: distlock::Error) -> Self {
        AppError
    }
}

// Items in the body stay in the body: a `use` or a type named like one in the signature does
// not change what the signature means.
#[distributed_lock("l:{x}", client = client)]
async fn body_use_shadows(client: &LockClient, x: u32) -> Result<u32, distlock::Error> {
    use std::io::Result;
    let r: Result<u32> = Ok(x);
    r.map_err(|_| distlock::Error::new(distlock::ErrorKind::Backend, "io"))
}

#[distributed_lock("m:{x}", client = client)]
async fn body_type_shadows(client: &LockClient, x: u32) -> Result<u32, AppError> {
    #[derive(Debug)]
    struct AppError;
    let _ = AppError;
    Ok(x)
}

fn main() {
    let client = LockClient::memory();
    drop((
        mutex(),
        read(),
        write(),
        permits(),
        on_lost(),
        ttl(),
        with_client(&client, 1),
        statements(),
        early_return(true),
        question_mark(),
        custom_error(),
        body_use_shadows(&client, 1),
        body_type_shadows(&client, 2),
    ));
}
