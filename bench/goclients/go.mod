module undolog.io/bench/goclients

go 1.26
