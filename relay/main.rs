/// mimalloc in place of the system allocator: a delivery allocates and
/// frees many small buffers (request, response, rows), and glibc's malloc
/// was a fifth of the relay's CPU per intent (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    outbox_relay::cli::main()
}
