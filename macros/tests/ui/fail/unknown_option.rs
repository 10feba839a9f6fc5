use distlock::distributed_lock;

#[distributed_lock("orders:{id}", retries = "3")]
async fn settle(id: u64) -> Result<(), distlock::Error> {
    let _ = id;
    Ok(())
}

fn main() {}
