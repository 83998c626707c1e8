module undolog.io/bench/ceiling

go 1.26
