module github.com/rld/rld

go 1.26

require (
	github.com/BurntSushi/toml v1.6.0
	github.com/HdrHistogram/hdrhistogram-go v1.2.0
	github.com/VictoriaMetrics/metrics v1.44.0
	github.com/cespare/xxhash/v2 v2.3.0
	github.com/go-jose/go-jose/v4 v4.1.9
	github.com/redis/rueidis v1.0.79
	github.com/stretchr/testify v1.12.1
	github.com/valyala/fasthttp v1.68.0
)

require (
	github.com/andybalholm/brotli v1.2.0 // indirect
	github.com/klauspost/compress v1.18.1 // indirect
	github.com/valyala/bytebufferpool v1.0.0 // indirect
	github.com/valyala/fastrand v1.1.0 // indirect
	github.com/valyala/histogram v1.2.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.47.0 // indirect
)
