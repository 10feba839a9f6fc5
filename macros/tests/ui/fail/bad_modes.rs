use distlock::distributed_lock;

#[distributed_lock("config", read, write)]
async fn both() -> Result<(), distlock::Error> {
    Ok(())
}

#[distributed_lock("exports", permits = 0)]
async fn no_permits() -> Result<(), distlock::Error> {
    Ok(())
}

#[distributed_lock("exports", permits = "8")]
async fn text_permits() -> Result<(), distlock::Error> {
    Ok(())
}

#[distributed_lock("config", read = true)]
async fn valued_read() -> Result<(), distlock::Error> {
    Ok(())
}

#[distributed_lock("config", write, permits = 2)]
async fn write_and_permits() -> Result<(), distlock::Error> {
    Ok(())
}

fn main() {}
