module github.com/nexjob/nexjob-aws/infra

go 1.26
