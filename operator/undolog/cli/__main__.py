from undolog.cli import main

main()
