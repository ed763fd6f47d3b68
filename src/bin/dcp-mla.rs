fn main() {
    println!("dcp-mla {}", env!("CARGO_PKG_VERSION"));
}
