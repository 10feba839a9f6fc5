//! A server whose wall clock is wrong: an `LD_PRELOAD` shim, compiled here at test time with
//! `cc`, that shifts what `clock_gettime(CLOCK_REALTIME*)`, `gettimeofday` and `time` return by
//! a fixed offset (monotonic clocks are left alone). A server started with
//! [`ClockShim::env`] believes it is another time of day; [`ClockShim::check`] proves it does.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::query_port;

/// The variable the shim reads its offset from, in microseconds (negative: behind).
const OFFSET_VAR: &str = "DISTLOCK_TEST_CLOCK_OFFSET_US";

const SHIM_C: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
#include <sys/select.h> /* struct timeval, without declaring gettimeofday */

static long long offset_us;

__attribute__((constructor)) static void distlock_shim_init(void) {
  const char *s = getenv("DISTLOCK_TEST_CLOCK_OFFSET_US");
  offset_us = s ? atoll(s) : 0;
}

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);
typedef int (*gettimeofday_fn)(struct timeval *, void *);

static void shift_ns(long long *sec, long long *nsec) {
  long long total = *sec * 1000000000LL + *nsec + offset_us * 1000LL;
  *sec = total / 1000000000LL;
  *nsec = total % 1000000000LL;
  if (*nsec < 0) {
    *nsec += 1000000000LL;
    *sec -= 1;
  }
}

int clock_gettime(clockid_t id, struct timespec *ts) {
  static clock_gettime_fn real;
  if (!real) real = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
  int r = real(id, ts);
  if (r == 0 && ts && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
    long long sec = ts->tv_sec, nsec = ts->tv_nsec;
    shift_ns(&sec, &nsec);
    ts->tv_sec = (time_t)sec;
    ts->tv_nsec = (long)nsec;
  }
  return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
  static gettimeofday_fn real;
  if (!real) real = (gettimeofday_fn)dlsym(RTLD_NEXT, "gettimeofday");
  int r = real(tv, tz);
  if (r == 0 && tv) {
    long long sec = tv->tv_sec, nsec = (long long)tv->tv_usec * 1000LL;
    shift_ns(&sec, &nsec);
    tv->tv_sec = (time_t)sec;
    tv->tv_usec = (suseconds_t)(nsec / 1000LL);
  }
  return r;
}

time_t time(time_t *t) {
  struct timespec ts;
  time_t now = (time_t)-1;
  if (clock_gettime(CLOCK_REALTIME, &ts) == 0) now = ts.tv_sec;
  if (t) *t = now;
  return now;
}
"#;

/// The compiled shim, in a temporary directory that lives as long as this value.
pub struct ClockShim {
    _dir: tempfile::TempDir,
    lib: PathBuf,
    offset_us: i64,
}

impl ClockShim {
    /// Compiles the shim for a clock `behind` the real one. Fails the test, saying why, if `cc`
    /// is missing or the compilation fails: a test of a skewed clock must not run unskewed.
    pub fn behind(behind: Duration) -> Self {
        let offset_us = -i64::try_from(behind.as_micros()).expect("a clock offset that fits");
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("clock_shim.c");
        let lib = dir.path().join("libclock_shim.so");
        std::fs::write(&src, SHIM_C).expect("write the clock shim's source");
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&lib)
            .arg(&src)
            .arg("-ldl")
            .output()
            .unwrap_or_else(|e| {
                panic!("the clock shim needs a C compiler: `cc` did not run ({e}); install one (Debian: `apt-get install gcc`)")
            });
        assert!(
            out.status.success() && lib.is_file(),
            "compiling the clock shim with `cc -shared -fPIC` failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Self {
            _dir: dir,
            lib,
            offset_us,
        }
    }

    /// The environment a server runs with to see the shifted clock.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".into(), self.lib.display().to_string()),
            (OFFSET_VAR.into(), self.offset_us.to_string()),
        ]
    }

    /// Asks the Redis server at `port` for its `TIME` and fails the test unless it is off from
    /// ours by the shim's offset (within `slack`). Returns how far behind it reads.
    pub fn check(&self, port: u16, slack: Duration) -> Duration {
        let (secs, micros): (String, String) =
            query_port(port, &mut ::redis::cmd("TIME")).expect("TIME on the shifted server");
        let server_us: i64 = secs.parse::<i64>().expect("TIME seconds") * 1_000_000
            + micros.parse::<i64>().expect("TIME microseconds");
        let ours_us = i64::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("a clock after 1970")
                .as_micros(),
        )
        .expect("µs since 1970 fit an i64");
        let off_us = server_us - ours_us;
        let slack_us = i64::try_from(slack.as_micros()).expect("a slack that fits");
        assert!(
            (off_us - self.offset_us).abs() <= slack_us,
            "the server on port {port} reads {off_us} µs off our clock, not {} µs: the clock shim \
             did not take (LD_PRELOAD {})",
            self.offset_us,
            self.lib.display()
        );
        Duration::from_micros(u64::try_from(-off_us).unwrap_or(0))
    }
}
