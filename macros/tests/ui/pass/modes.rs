use distlock::{distributed_lock, LockClient};

#[distributed_lock("config", read, client = client)]
async fn read_config(client: &LockClient) -> Result<(), distlock::Error> {
    Ok(())
}

#[distributed_lock("config", write, timeout = "1s", client = client)]
async fn write_config(client: &LockClient) -> Result<(), distlock::Error> {
    Ok(())
}

#[distributed_lock("exports:{region}", permits = 8, wait = false)]
async fn export(region: &str) -> Result<(), distlock::Error> {
    Ok(())
}

fn main() {
    let client = LockClient::memory();
    let _ = read_config(&client);
    let _ = write_config(&client);
    let _ = export("eu");
}
