from undolog.cli.app import main

main()
