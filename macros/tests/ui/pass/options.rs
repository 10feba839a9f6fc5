use distlock::{distributed_lock, LockClient};

struct Service {
    locks: LockClient,
}

impl Service {
    #[distributed_lock("orders:{order_id:>08}", client = &self.locks, timeout = "1.5s", ttl = "2m", on_lost = "abort")]
    async fn settle(&self, order_id: u64) -> Result<(), distlock::Error> {
        Ok(())
    }
}

struct Wrapper(u64);

#[distributed_lock("jobs:{id}", crate = "::distlock", wait = false, ttl = "250ms")]
async fn destructured(Wrapper(id): Wrapper) -> std::io::Result<u64> {
    Ok(id)
}

impl From<distlock::Error> for Boxed {
    fn from(e: distlock::Error) -> Self {
        Boxed(Box::new(e))
    }
}
struct Boxed(Box<dyn std::error::Error + Send + Sync>);

#[distributed_lock("plain")]
async fn no_placeholders() -> Result<(), Boxed> {
    Ok(())
}

// `?` converts errors in the body as it would without the attribute.
#[distributed_lock("parse:{text}")]
async fn question_mark(text: &str) -> std::io::Result<u32> {
    let client = LockClient::connect("memory:").await?;
    drop(client);
    let n: u32 = text.parse().map_err(std::io::Error::other)?;
    if n == 0 {
        return Err(std::io::Error::other("zero"));
    }
    Ok(n)
}

fn main() {
    let _ = question_mark("1");
    let _ = Service { locks: LockClient::memory() }.settle(1);
    let _ = destructured(Wrapper(1));
    let _ = no_placeholders();
}
