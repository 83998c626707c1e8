module undolog.io/bench/floor

go 1.26
