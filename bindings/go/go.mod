module kvx.dev/kvx

go 1.19
