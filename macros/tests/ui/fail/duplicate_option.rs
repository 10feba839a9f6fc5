use distlock::distributed_lock;

#[distributed_lock("orders:{id}", ttl = "5s", ttl = "10s")]
async fn settle(id: u64) -> Result<(), distlock::Error> {
    let _ = id;
    Ok(())
}

fn main() {}
